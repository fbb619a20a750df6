"""Gemma 2 and Gemma 3 (text) decoders with a key/value cache and Hugging Face parameter names.

What sets them apart from the Llama family (training/llama.py), following transformers' modeling_gemma2.py /
modeling_gemma3.py:
  - token embeddings multiplied by sqrt(hidden_size), the factor rounded to the model's dtype first;
  - RMSNorm scaled by (1 + weight) (weights start at 0), computed in fp32;
  - four norms per block: input_layernorm -> attention -> post_attention_layernorm, residual add, then
    pre_feedforward_layernorm -> MLP -> post_feedforward_layernorm, residual add;
  - MLP down(gelu_tanh(gate(x)) * up(x)) (`hidden_activation` gelu_pytorch_tanh);
  - attention scores scaled by query_pre_attn_scalar**-0.5 (not head_dim**-0.5);
  - Gemma 2: attention scores soft-capped (cap * tanh(s / cap), attn_logit_softcapping) before the mask;
  - final logits soft-capped the same way (final_logit_softcapping);
  - `layer_types`: "sliding_attention" layers see the last `sliding_window` positions (key index > query index -
    sliding_window, the query's own included), "full_attention" layers everything. Gemma 2 alternates (sliding
    first); Gemma 3 repeats `sliding_window_pattern` (default 6: five sliding, one full) when layer_types is absent;
  - Gemma 3: RMSNorms over each head of q and k (q_norm / k_norm) before rotary, and its own rotary base on sliding
    layers (rope_local_base_freq, 10k) and on full ones (rope_theta, 1M), a linear rope scaling on full layers
    when the config sets one.

Gemma 3's config may carry attn_logit_softcapping, but transformers' Gemma 3 attention never applies it; neither
do we (logged). The cache keeps every position (keys after q/k norm and rotary) on every layer, as the in-place
graph does: a sliding layer masks what is older than its window instead of dropping it.

Refused with a ValueError naming the config key: bidirectional attention, attention biases, another activation,
rope types other than default (linear on Gemma 3's full layers), unknown layer types, sliding layers without a
window.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from training.gpt import cache_inputs, generate_greedy  # noqa: F401  (generate_greedy: model-agnostic)
from training.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, apply_rotary

log = logging.getLogger(__name__)

KV = tuple[torch.Tensor, torch.Tensor]

FAMILIES = {"gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
SLIDING, FULL = "sliding_attention", "full_attention"
ACTIVATIONS = ("gelu_pytorch_tanh",)


@dataclass
class GemmaConfig:
    """Gemma 2 / Gemma 3 text sizes under Hugging Face's config.json names (rope bases flattened)."""

    model_type: str = "gemma3_text"    # gemma2 | gemma3_text
    vocab_size: int = 262208
    hidden_size: int = 1152
    intermediate_size: int = 6912
    num_hidden_layers: int = 26
    num_attention_heads: int = 4
    num_key_value_heads: int = 1
    head_dim: int = 256
    hidden_activation: str = "gelu_pytorch_tanh"
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0            # full-attention layers (Gemma 2: every layer)
    rope_local_base_freq: float = 10_000.0     # Gemma 3's sliding layers
    rope_linear_factor: float = 1.0            # Gemma 3's full layers: positions / factor (1 = no scaling)
    query_pre_attn_scalar: float = 256
    sliding_window: int | None = 512
    layer_types: list[str] = field(default_factory=list)   # [] = the family's default pattern
    sliding_window_pattern: int = 6            # Gemma 3's default pattern when layer_types is empty
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    attention_dropout: float = 0.0
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02
    bos_token_id: int | None = 2
    eos_token_id: int | None = 1
    pad_token_id: int | None = 0

    def __post_init__(self) -> None:
        if self.model_type not in FAMILIES:
            raise ValueError(f"model_type: unsupported {self.model_type!r} (one of {sorted(FAMILIES)})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_key_value_heads: {self.num_key_value_heads} does not divide "
                             f"num_attention_heads={self.num_attention_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim: rotary needs an even head_dim, got {self.head_dim}")
        if self.hidden_activation not in ACTIVATIONS:
            raise ValueError(f"hidden_activation: only {ACTIVATIONS} is supported, got {self.hidden_activation!r}")
        if not self.layer_types:
            self.layer_types = default_layer_types(self.model_type, self.num_hidden_layers,
                                                   self.sliding_window_pattern)
        self.layer_types = list(self.layer_types)
        if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - {SLIDING, FULL}:
            raise ValueError(f"layer_types: expected {self.num_hidden_layers} of {SLIDING!r} / {FULL!r}, "
                             f"got {self.layer_types!r}")
        if SLIDING in self.layer_types and not self.sliding_window:
            raise ValueError(f"sliding_window: sliding layers need a window, got {self.sliding_window!r}")
        if self.model_type == "gemma2" and self.rope_linear_factor != 1.0:
            raise ValueError("rope_parameters: Gemma 2 has no rope scaling here")
        if isinstance(self.eos_token_id, list):  # HF allows several; greedy reference stops on the first
            self.eos_token_id = self.eos_token_id[0] if self.eos_token_id else None

    @property
    def architecture(self) -> str:
        return FAMILIES[self.model_type]

    # Gemma has no biases (attention_bias true is refused); Llama's attention and MLP modules read these.
    qkv_bias = o_bias = mlp_bias = False
    fused = False      # q/k/v and gate/up in Linears of their own (Phi-3's fused layout is Llama's only)

    def rotary_layer(self, i: int) -> bool:
        """Every Gemma layer rotates (SmolLM3's NoPE layers are Llama's only)."""
        return True

    @property
    def qk_norm(self) -> bool:
        return self.model_type == "gemma3_text"

    @property
    def attention_softcap(self) -> float | None:
        """The cap transformers applies to attention scores (Gemma 3's attention ignores its config's value)."""
        return self.attn_logit_softcapping if self.model_type == "gemma2" else None

    def window(self, layer: int) -> int | None:
        """How many positions layer `layer` sees (the query's own included); None = all."""
        return self.sliding_window if self.layer_types[layer] == SLIDING else None

    def rope(self, layer_type: str) -> tuple[float, float]:
        """(rotary base, linear factor) of a layer type."""
        if self.model_type == "gemma3_text" and layer_type == SLIDING:
            return self.rope_local_base_freq, 1.0
        return self.rope_theta, self.rope_linear_factor

    def to_hf_dict(self) -> dict[str, Any]:
        """config.json content (without architectures), in transformers 5's layout."""
        d = dataclasses.asdict(self)
        for key in ("rope_theta", "rope_local_base_freq", "rope_linear_factor", "sliding_window_pattern"):
            d.pop(key)
        if self.model_type == "gemma2":
            d["rope_parameters"] = {"rope_type": "default", "rope_theta": self.rope_theta}
        else:
            full = {"rope_type": "default", "rope_theta": self.rope_theta}
            if self.rope_linear_factor != 1.0:
                full.update(rope_type="linear", factor=self.rope_linear_factor)
            d["rope_parameters"] = {SLIDING: {"rope_type": "default", "rope_theta": self.rope_local_base_freq},
                                    FULL: full}
        d.update(attention_bias=False, use_bidirectional_attention=False)
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "GemmaConfig":
        """Build from an HF Gemma2Config / Gemma3TextConfig dict; keys we do not model are ignored, settings we
        would silently get wrong are refused by name."""
        model_type = d.get("model_type", "gemma3_text")
        if d.get("use_bidirectional_attention"):
            raise ValueError("use_bidirectional_attention: only causal Gemma decoders are supported")
        if d.get("attention_bias"):
            raise ValueError("attention_bias: Gemma checkpoints with attention biases are not supported")
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["layer_types"] = list(d.get("layer_types") or [])
        if kw.get("sliding_window_pattern") is None:
            kw.pop("sliding_window_pattern", None)
        kw.update(_rope_settings(model_type, d), model_type=model_type)
        if model_type == "gemma3_text" and d.get("attn_logit_softcapping") is not None:
            log.info("attn_logit_softcapping=%s: not applied (transformers' Gemma 3 attention ignores it)",
                     d["attn_logit_softcapping"])
        return cls(**kw)


def default_layer_types(model_type: str, layers: int, pattern: int) -> list[str]:
    """transformers' defaults: Gemma 2 alternates sliding/full; Gemma 3 makes every `pattern`-th layer full."""
    every = 2 if model_type == "gemma2" else pattern
    return [SLIDING if (i + 1) % every else FULL for i in range(layers)]


def _rope_type(params: dict, where: str, allowed: tuple[str, ...]) -> str:
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in allowed:
        raise ValueError(f"{where}.rope_type: only {allowed} is supported, got {kind!r}")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"{where}.partial_rotary_factor: partial rotary is not supported")
    return kind


def _rope_settings(model_type: str, d: dict[str, Any]) -> dict[str, float]:
    """rope_theta / rope_local_base_freq / rope_linear_factor from transformers 5's rope_parameters (per layer
    type on Gemma 3) or the older top-level rope_theta, rope_local_base_freq and rope_scaling keys."""
    rope = d.get("rope_parameters") or {}
    scaling = d.get("rope_scaling")
    if not isinstance(rope, dict) or (scaling is not None and not isinstance(scaling, dict)):
        raise ValueError(f"rope_parameters: expected an object, got {rope!r} / rope_scaling {scaling!r}")
    if model_type == "gemma2":
        _rope_type(rope, "rope_parameters", ("default",))
        if scaling is not None:
            _rope_type(scaling, "rope_scaling", ("default",))
        return {"rope_theta": float(rope.get("rope_theta", d.get("rope_theta") or 10_000.0))}
    full = dict(rope.get(FULL) or {}) if FULL in rope or SLIDING in rope else {}
    local = dict(rope.get(SLIDING) or {}) if FULL in rope or SLIDING in rope else {}
    full.update(scaling or {})
    _rope_type(local, f"rope_parameters.{SLIDING}", ("default",))
    kind = _rope_type(full, f"rope_parameters.{FULL}", ("default", "linear"))
    return {"rope_theta": float(full.get("rope_theta", d.get("rope_theta") or 1_000_000.0)),
            "rope_local_base_freq": float(local.get("rope_theta", d.get("rope_local_base_freq") or 10_000.0)),
            "rope_linear_factor": float(full.get("factor", 1.0)) if kind == "linear" else 1.0}


def inv_freq(config: GemmaConfig, layer_type: str) -> torch.Tensor:
    """Rotary inverse frequencies [head_dim / 2] of a layer type (linear scaling divides them by its factor)."""
    base, factor = config.rope(layer_type)
    d = config.head_dim
    return 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d)) / factor


class GemmaRMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Gemma's order: normalise and scale by (1 + w) in fp32, cast back at the end (Llama casts before scaling).
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


def softcap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    return x if cap is None else torch.tanh(x / cap) * cap


class GemmaAttention(LlamaAttention):
    """Llama's projections (no biases) with Gemma's q/k norms, scale, soft-capping and sliding window."""

    def __init__(self, config: GemmaConfig, layer: int) -> None:
        super().__init__(config)
        self.scale = config.query_pre_attn_scalar ** -0.5
        self.cap = config.attention_softcap
        self.window = config.window(layer)
        if config.qk_norm:
            self.q_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps)
            self.k_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps)

    def _heads(self, proj: nn.Linear, x: torch.Tensor, heads: int) -> torch.Tensor:
        """[B, S, hidden] -> [B, heads, S, head_dim]."""
        return proj(x).unflatten(-1, (heads, self.head_dim)).transpose(1, 2)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, allowed: torch.Tensor,
                past: KV) -> tuple[torch.Tensor, KV]:
        """x [B, S, hidden]; allowed bool [B, 1, S, P+S] (causal and padding); past (k, v) [B, kv_heads, P, D]."""
        q = self._heads(self.q_proj, x, self.num_heads)
        k = self._heads(self.k_proj, x, self.num_kv_heads)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        k = torch.cat([past[0], k], dim=2)
        v = torch.cat([past[1], self._heads(self.v_proj, x, self.num_kv_heads)], dim=2)
        if self.window is not None:
            # Key index > query index - window (transformers' sliding_window_overlay), over cache indices.
            qpos = torch.arange(k.shape[2] - x.shape[1], k.shape[2], device=x.device)[:, None]
            allowed = allowed & (torch.arange(k.shape[2], device=x.device) > qpos - self.window)
        # Each kv head serves `groups` consecutive query heads (HF's repeat_kv layout).
        kr, vr = (t.repeat_interleave(self.groups, dim=1) for t in (k, v))
        scores = softcap(q @ kr.transpose(-1, -2) * self.scale, self.cap)
        # finfo.min, not -inf: a left-pad query that sees nothing gets a finite row, not NaN.
        probs = torch.softmax(scores.masked_fill(~allowed, torch.finfo(scores.dtype).min).float(), dim=-1)
        y = (self.attn_dropout(probs.to(q.dtype)) @ vr).transpose(1, 2).flatten(2)
        return self.o_proj(y), (k, v)


class GemmaMLP(LlamaMLP):
    """down(gelu_tanh(gate(x)) * up(x)): Llama's three projections, another activation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class GemmaDecoderLayer(nn.Module):
    def __init__(self, config: GemmaConfig, layer: int) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.layer_type = config.layer_types[layer]
        self.self_attn = GemmaAttention(config, layer)
        self.mlp = GemmaMLP(config)
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, allowed: torch.Tensor,
                past: KV) -> tuple[torch.Tensor, KV]:
        a, present = self.self_attn(self.input_layernorm(x), cos, sin, allowed, past)
        x = x + self.post_attention_layernorm(a)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x))), present


class GemmaModel(nn.Module):
    def __init__(self, config: GemmaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(GemmaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        for kind in sorted(set(config.layer_types)):
            self.register_buffer(f"{kind}_inv_freq", inv_freq(config, kind), persistent=False)

    def rotary(self, kind: str, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [B, S, head_dim] of a layer type at the given positions (angles computed in fp32)."""
        freqs = position_ids[..., None].float() * getattr(self, f"{kind}_inv_freq")
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


class GemmaForCausalLM(nn.Module):
    """Decoder + LM head (tied to embed_tokens when tie_word_embeddings, as every released Gemma is)."""

    def __init__(self, config: GemmaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = GemmaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        # Linear and embedding weights ~ N(0, initializer_range); the norms stay at 0, i.e. a scale of 1.
        for weight in (mod.weight for mod in self.modules() if isinstance(mod, (nn.Linear, nn.Embedding))):
            nn.init.normal_(weight, mean=0.0, std=config.initializer_range)
        self.tie_weights()

    # The same attributes under the same names as the Llama model's: its helpers serve as they are.
    tie_weights = LlamaForCausalLM.tie_weights
    empty_past = LlamaForCausalLM.empty_past

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                past_key_values: list[KV] | None = None) -> tuple[torch.Tensor, list[KV]]:
        """training/llama.py's convention: input_ids [B, S]; attention_mask [B, P+S]; position_ids [B, S];
        past_key_values per layer (k, v) [B, kv_heads, P, head_dim] -> (logits [B, S, V], presents [.., P+S, ..])."""
        m, dev = self.model, input_ids.device
        past_key_values = past_key_values or self.empty_past(len(input_ids), dev, m.embed_tokens.weight.dtype)
        position_ids, allowed = cache_inputs(attention_mask, position_ids, *input_ids.shape,
                                             past_key_values[0][0].shape[2], dev)
        x = m.embed_tokens(input_ids)
        x = x * torch.tensor(self.config.hidden_size ** 0.5, dtype=x.dtype)   # the factor in the model's dtype first
        ropes = {kind: m.rotary(kind, position_ids, x.dtype) for kind in set(self.config.layer_types)}
        presents: list[KV] = []
        for layer, past in zip(m.layers, past_key_values):
            x, present = layer(x, *ropes[layer.layer_type], allowed, past)
            presents.append(present)
        return softcap(self.lm_head(m.norm(x)), self.config.final_logit_softcapping), presents
