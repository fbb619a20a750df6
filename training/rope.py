"""Rotary position embedding's frequencies for the Llama-family decoder (training/llama.py) and its exported graph
(export/decoder_graph.py), equal to transformers' `ROPE_INIT_FUNCTIONS` (modeling_rope_utils.py).

A config carries its rotary settings in `rope_parameters` (transformers 5.x: `rope_type`, `rope_theta`, the type's
own keys) or, in older files, `rope_scaling` (`type` or `rope_type`) beside a top-level `rope_theta`; Phi-3 keeps
`original_max_position_embeddings` at the top level, which then wins over the dict's (as transformers does).

Types and where they equal transformers (docs/checkpoint-format.md, "Rotary position embedding"):
- default, linear, llama3, yarn: position-independent frequencies (and yarn's attention factor, which scales cos and
  sin): exact at every position.
- longrope (Phi-3): transformers picks the short factors when a call's largest position + 1 is at most
  original_max_position_embeddings and the long ones otherwise, per forward call. Our PyTorch model does the same;
  a static cos/sin table cannot switch, so the exported graph is exact only while the package's max length is at
  most original_max_position_embeddings (short factors) and is refused beyond (`exact_up_to`).
- dynamic (NTK): transformers keeps the plain frequencies until a sequence grows past max_position_embeddings,
  then rescales them in place (state kept across calls). Exact up to max_position_embeddings; our model refuses
  positions past it and the export refuses a longer package.
- anything else (proportional, mrope, ...) is refused by name.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
# Keys each type reads (beside rope_type / type / rope_theta / partial_rotary_factor): a key we do not know is
# ignored by transformers too, but one it reads and we did not would be served approximately, so only these pass.
_KEYS = {"default": (), "linear": ("factor",), "dynamic": ("factor",),
         "yarn": ("factor", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                  "original_max_position_embeddings", "truncate"),
         "longrope": ("factor", "attention_factor", "short_factor", "long_factor", "original_max_position_embeddings"),
         "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
_COMMON = ("rope_type", "type", "rope_theta", "partial_rotary_factor")


@dataclass(frozen=True)
class Rope:
    """One model's rotary settings, normalised; `params` holds the type's own keys."""

    rope_type: str = "default"
    theta: float = 10000.0
    partial_rotary_factor: float = 1.0
    params: dict[str, Any] = field(default_factory=dict)

    def rotary_dim(self, head_dim: int) -> int:
        return int(head_dim * self.partial_rotary_factor)

    def exact_up_to(self, max_position_embeddings: int) -> int | None:
        """The longest sequence a static cos/sin table serves as transformers does; None = any length."""
        if self.rope_type == "longrope":
            return int(self.params["original_max_position_embeddings"])
        if self.rope_type == "dynamic":
            return max_position_embeddings
        return None

    def to_hf(self) -> dict[str, Any]:
        """The `rope_parameters` dict to write into config.json."""
        d: dict[str, Any] = {"rope_type": self.rope_type, "rope_theta": self.theta, **self.params}
        if self.partial_rotary_factor != 1.0:
            d["partial_rotary_factor"] = self.partial_rotary_factor
        return d

    def inv_freq(self, head_dim: int, max_position_embeddings: int, seq_len: int | None = None,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, float]:
        """(inverse frequencies [rotary_dim / 2], attention factor that multiplies cos and sin) for a call whose
        largest position + 1 is `seq_len` (None: the model's start-up table, as transformers builds it)."""
        dim = self.rotary_dim(head_dim)
        exps = torch.arange(0, dim, 2, dtype=torch.int64).to(dtype) / dim
        plain = 1.0 / (self.theta ** exps)
        p, kind = self.params, self.rope_type
        if kind == "default":
            return plain, 1.0
        if kind == "linear":
            return plain / p["factor"], 1.0
        if kind == "dynamic":
            n = max(seq_len or max_position_embeddings, max_position_embeddings)
            factor = p["factor"]
            base = self.theta * ((factor * n / max_position_embeddings) - (factor - 1)) ** (dim / (dim - 2))
            return 1.0 / (base ** exps), 1.0
        if kind == "llama3":
            return _llama3(plain, p), 1.0
        if kind == "yarn":
            return _yarn(self.theta, dim, exps, p, max_position_embeddings, dtype)
        return _longrope(self.theta, exps, p, max_position_embeddings, seq_len, dtype)


def _llama3(inv: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1: long wavelengths divided by factor, short ones kept, a smooth blend between."""
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old = p["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, blended, scaled)


def _yarn(theta: float, dim: int, exps: torch.Tensor, p: dict[str, Any], max_pos: int,
          dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    """YaRN: per frequency a ramp between interpolated (/ factor) and original, and an attention factor."""
    original = p["original_max_position_embeddings"]
    factor = p.get("factor") or max_pos / original

    def mscale_of(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = p.get("attention_factor")
    if attention is None:
        m, m_all = p.get("mscale"), p.get("mscale_all_dim")
        attention = float(mscale_of(factor, m) / mscale_of(factor, m_all)) if m and m_all else mscale_of(factor)
    fast, slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(fast), correction_dim(slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001   # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=dtype) - low) / (high - low), 0, 1)
    freqs = theta ** exps
    keep = 1 - ramp     # 1: the original frequency (extrapolation), 0: interpolated
    return (1.0 / (factor * freqs)) * (1 - keep) + (1.0 / freqs) * keep, attention


def _longrope(theta: float, exps: torch.Tensor, p: dict[str, Any], max_pos: int, seq_len: int | None,
              dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    original = p["original_max_position_embeddings"]
    factor = p.get("factor") or max_pos / original
    attention = p.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = p["long_factor"] if seq_len and seq_len > original else p["short_factor"]
    # transformers holds the factors in float32 whatever the table's precision
    ext_t = torch.tensor(ext, dtype=torch.float32).to(dtype)
    return 1.0 / (ext_t * theta ** exps), attention


def rope_from_hf(d: dict[str, Any], model_type: str, head_dim: int) -> Rope:
    """The rotary settings of an HF config dict; what we would get wrong is refused (ValueError naming the key)."""
    rope = d.get("rope_parameters")
    scaling = d.get("rope_scaling")
    if rope is not None and not isinstance(rope, dict):
        raise ValueError(f"rope_parameters: expected an object, got {rope!r}")
    if scaling is not None and not isinstance(scaling, dict):
        raise ValueError(f"rope_scaling: expected an object or null, got {scaling!r}")
    where = "rope_scaling" if scaling else "rope_parameters"
    src = dict(scaling or rope or {})   # transformers: rope_scaling, when set, replaces rope_parameters
    kind = src.get("rope_type", src.get("type", "default"))
    if model_type == "phi3" and kind in ("su", "yarn"):
        kind = "longrope"   # Phi-3's old names for longrope (Phi3Config renames them)
    if kind not in TYPES:
        raise ValueError(f"{where}.rope_type: unsupported {kind!r} (one of {', '.join(TYPES)})")
    theta = src.get("rope_theta", d.get("rope_theta")) or 10000.0
    partial = float(src.get("partial_rotary_factor", d.get("partial_rotary_factor")) or 1.0)
    unknown = sorted(set(src) - set(_COMMON) - set(_KEYS[kind]))
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: not read for rope_type {kind!r} here")
    params = {k: src[k] for k in _KEYS[kind] if k in src}
    if kind in ("llama3", "yarn", "longrope"):
        # Phi-3 keeps the pretraining length at the top level (its config class defaults it to 4096), and
        # transformers lets that win over the dict's.
        top = d.get("original_max_position_embeddings", 4096 if model_type == "phi3" else None)
        params["original_max_position_embeddings"] = int(
            top or params.get("original_max_position_embeddings") or d.get("max_position_embeddings", 2048))
    for key in {"linear": ("factor",), "dynamic": ("factor",), "llama3": _KEYS["llama3"][:3],
                "longrope": ("short_factor", "long_factor")}.get(kind, ()):
        if params.get(key) is None:
            raise ValueError(f"{where}.{key}: required for rope_type {kind!r}")
    if kind == "longrope":
        for key in ("short_factor", "long_factor"):
            if len(params[key]) != int(head_dim * partial) // 2:
                raise ValueError(f"{where}.{key}: {len(params[key])} values, the rotary half-width is "
                                 f"{int(head_dim * partial) // 2}")
    if partial != 1.0 and model_type != "phi3":
        # transformers' Llama / Qwen / SmolLM3 rotate the whole head whatever this says (or fail on it)
        raise ValueError(f"partial_rotary_factor: {partial} is honoured for phi3 only here, not {model_type!r}")
    if int(head_dim * partial) % 2:
        raise ValueError(f"partial_rotary_factor: rotary dim {head_dim} x {partial} is odd")
    return Rope(kind, float(theta), partial, params)
