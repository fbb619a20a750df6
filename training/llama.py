"""Llama-family decoder (Llama, Qwen2, Mistral, Qwen3, SmolLM3, Phi-3) with a key/value cache and Hugging Face
parameter names.

Pre-RMSNorm blocks, rotary position embedding (HF's rotate-half convention: the head dimension is split
in two halves, not interleaved pairs), SwiGLU MLP, grouped-query attention (num_key_value_heads divides
num_attention_heads; query head h reads kv head h // (heads / kv_heads)), tied or untied LM head, optional
biases (Qwen2: q/k/v; Llama's attention_bias: q/k/v/o). Qwen3: a per-head RMSNorm on q and k before rotary
(q_norm / k_norm) and a head_dim of its own. SmolLM3: layers without rotary (no_rope_layers[i] == 0; by default
every no_rope_layer_interval-th layer). Phi-3: q|k|v and gate|up fused under HF's names (qkv_proj, gate_up_proj)
and optional partial rotary (the first rotary_dim channels of each head rotate, the rest pass).

Rotary frequencies come from training/rope.py (default, linear, dynamic, yarn, longrope, llama3, as transformers
computes them; yarn / longrope's attention factor multiplies cos and sin).

Same call convention as training/gpt.py: one code path for the prompt (past length 0) and each cached
step, an explicit causal AND padding mask over absolute positions, left padding through the mask and
position ids that count only real tokens. The cache holds keys AFTER rotary, per kv head:
past/present (k, v) each [B, num_key_value_heads, P, head_dim].

Attention is computed like HF's eager path in fp32 (scores * head_dim**-0.5, masked with finfo.min,
softmax, @ v): this module is the PyTorch reference for the exported decoder graph.

Refused with a ValueError naming the field: a rope type training/rope.py does not compute, partial rotary outside
Phi-3, positions past max_position_embeddings under dynamic rope (transformers then rescales with state), and a
sliding window that would be active (sliding_window set and smaller than max_position_embeddings; Qwen2 / Qwen3 /
SmolLM3 only when use_sliding_window is true) outside Phi-3. Phi-3's window is honoured as transformers' mask does:
a query at cache column q sees columns (q - sliding_window, q] (so, under left padding, the pad columns count).
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from training.gpt import cache_inputs, generate_greedy  # noqa: F401  (generate_greedy: model-agnostic)
from training.rope import Rope, rope_from_hf

log = logging.getLogger(__name__)

KV = tuple[torch.Tensor, torch.Tensor]

FAMILIES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
FAMILIES.update(qwen3="Qwen3ForCausalLM", smollm3="SmolLM3ForCausalLM", phi3="Phi3ForCausalLM")
# Families whose use_sliding_window switches sliding_window on; the others apply any window set.
_WINDOW_SWITCHED = ("qwen2", "qwen3", "smollm3")

_PRESETS: dict[str, dict[str, int]] = {
    # Same depth/width as GPT-2's presets (training/gpt.py); kv heads = heads / 2; SwiGLU width ~ 8/3 * hidden.
    "tiny": dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=176, max_position_embeddings=128),
    "small": dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=688, max_position_embeddings=256),
    "base": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, num_key_value_heads=4,
                 intermediate_size=2048, max_position_embeddings=1024),
}


@dataclass
class LlamaConfig:
    """Llama / Qwen2 / Mistral sizes under Hugging Face's config.json names."""

    model_type: str = "llama"          # a FAMILIES key: decides bias layout, fused weights, q/k norm, architectures
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None  # None = num_attention_heads (plain multi-head)
    head_dim: int | None = None             # None = hidden_size // num_attention_heads
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False       # llama: bias on q/k/v/o; qwen2 ignores it (q/k/v always biased)
    mlp_bias: bool = False
    attention_dropout: float = 0.0
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    rope_parameters: dict | None = None    # training/rope.py's normalised dict; None = default at rope_theta
    original_max_position_embeddings: int | None = None   # phi3 keeps it here (not in rope_parameters)
    no_rope_layers: list[int] | None = None  # smollm3: 1 = the layer rotates, 0 = no rotary (NoPE)
    no_rope_layer_interval: int = 4          # smollm3: without no_rope_layers, every n-th layer is NoPE
    sliding_window: int | None = None        # phi3 only (others refuse an active window): keys a query sees

    def __post_init__(self) -> None:
        if self.model_type not in FAMILIES:
            raise ValueError(f"model_type: unsupported {self.model_type!r} (one of {sorted(FAMILIES)})")
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_key_value_heads: {self.num_key_value_heads} does not divide "
                             f"num_attention_heads={self.num_attention_heads}")
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(f"hidden_size: {self.hidden_size} is not a multiple of "
                                 f"num_attention_heads={self.num_attention_heads}")
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.head_dim % 2:
            raise ValueError(f"head_dim: rotary needs an even head_dim, got {self.head_dim}")
        if self.model_type == "phi3" and self.original_max_position_embeddings is None:
            self.original_max_position_embeddings = 4096   # Phi3Config's default
        self.rope: Rope = rope_from_hf({"rope_parameters": self.rope_parameters, "rope_theta": self.rope_theta,
                                        "max_position_embeddings": self.max_position_embeddings,
                                        "original_max_position_embeddings": self.original_max_position_embeddings},
                                       self.model_type, self.head_dim)
        if self.sliding_window is not None and self.model_type != "phi3":
            raise ValueError(f"sliding_window: honoured for phi3 only, not {self.model_type!r}")
        if self.model_type == "smollm3" and self.no_rope_layers is None:
            n = self.no_rope_layer_interval
            self.no_rope_layers = [int((i + 1) % n != 0) for i in range(self.num_hidden_layers)]
        if self.no_rope_layers is not None and len(self.no_rope_layers) != self.num_hidden_layers:
            raise ValueError(f"no_rope_layers: {len(self.no_rope_layers)} entries for {self.num_hidden_layers} layers")
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act: only 'silu' (SwiGLU) is supported, got {self.hidden_act!r}")
        if isinstance(self.eos_token_id, list):  # HF allows several; greedy reference stops on the first
            self.eos_token_id = self.eos_token_id[0] if self.eos_token_id else None

    @property
    def qkv_bias(self) -> bool:
        return self.model_type == "qwen2" or (self.attention_bias and self.model_type != "phi3")

    @property
    def o_bias(self) -> bool:
        return self.model_type in ("llama", "qwen3", "smollm3") and self.attention_bias

    @property
    def fused(self) -> bool:
        """Phi-3 stores q|k|v and gate|up as one Linear each."""
        return self.model_type == "phi3"

    @property
    def qk_norm(self) -> bool:
        return self.model_type == "qwen3"

    def rotary_layer(self, i: int) -> bool:
        return self.no_rope_layers is None or bool(self.no_rope_layers[i])

    @property
    def architecture(self) -> str:
        return FAMILIES[self.model_type]

    @classmethod
    def preset(cls, name: str, vocab_size: int, **overrides: Any) -> "LlamaConfig":
        """`tiny` / `small` / `base` sizes; any other field can be overridden."""
        if name not in _PRESETS:
            raise ValueError(f"preset: unknown Llama preset {name!r} (one of {sorted(_PRESETS)})")
        return cls(vocab_size=vocab_size, **{**_PRESETS[name], **overrides})

    def to_hf_dict(self) -> dict[str, Any]:
        """config.json content (without architectures)."""
        d = dataclasses.asdict(self)
        # transformers 5.x keeps rope settings in rope_parameters; rope_theta too for older readers.
        d["rope_parameters"] = self.rope.to_hf()
        d["rope_scaling"] = None
        for key in ("original_max_position_embeddings", "no_rope_layers", "sliding_window"):
            if d[key] is None:   # a None here would shadow the rope dict's value in transformers
                d.pop(key)
        if self.model_type != "smollm3":
            d.pop("no_rope_layer_interval")
        if self.model_type in ("qwen2", "qwen3", "smollm3"):
            d.update(use_sliding_window=False, sliding_window=None, max_window_layers=self.num_hidden_layers)
        if self.model_type in ("qwen2", "mistral", "phi3"):
            d.pop("attention_bias")
        if self.model_type in ("qwen2", "mistral", "qwen3", "phi3"):
            d.pop("mlp_bias")
        if self.model_type == "mistral":
            d["sliding_window"] = None
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "LlamaConfig":
        """Build from an HF config dict of the family; keys we do not model are ignored, settings we would
        silently get wrong are refused."""
        model_type = d.get("model_type", "llama")
        if model_type not in FAMILIES:
            raise ValueError(f"model_type: unsupported {model_type!r} (one of {sorted(FAMILIES)})")
        heads = d.get("num_attention_heads") or 1
        rope = rope_from_hf(d, model_type, int(d.get("head_dim") or d.get("hidden_size", heads) // heads))
        window = d.get("sliding_window")
        max_pos = d.get("max_position_embeddings", 2048)
        active = window is not None and window < max_pos
        if model_type in _WINDOW_SWITCHED:
            active = active and bool(d.get("use_sliding_window", False))
        if active and model_type != "phi3":
            raise ValueError(f"sliding_window: {window} < max_position_embeddings {max_pos} would restrict attention "
                             "(sliding-window attention is not supported; a checkpoint with sliding_window null loads)")
        if d.get("pretraining_tp", 1) not in (1, None):
            log.info("pretraining_tp=%s ignored (only changes how HF splits matmuls)", d.get("pretraining_tp"))
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw.update(model_type=model_type, rope_theta=rope.theta, rope_parameters=rope.to_hf())
        if model_type != "phi3":
            kw.pop("sliding_window", None)   # inactive here (checked above)
        return cls(**kw)


class LlamaRMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalised in fp32, scaled after casting back (HF's order).
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class LlamaRotaryEmbedding(nn.Module):
    """cos/sin [B, S, rotary_dim] for the given positions; angles of frequency pair i repeated in both halves, times
    the rope type's attention factor (transformers scales cos and sin, so q.k by its square)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.rope, self.head_dim, self.max_pos = config.rope, config.head_dim, config.max_position_embeddings
        inv_freq, self.attention_scaling = self.rope.inv_freq(self.head_dim, self.max_pos)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _inv_freq(self, position_ids: torch.Tensor) -> torch.Tensor:
        """transformers' per-call choices: longrope's long factors past original_max_position_embeddings; dynamic
        rescaling past max_position_embeddings (stateful there), which we refuse."""
        kind = self.rope.rope_type
        if kind not in ("longrope", "dynamic") or position_ids.numel() == 0:
            return self.inv_freq
        seq_len = int(position_ids.max()) + 1
        if kind == "dynamic":
            if seq_len > self.max_pos:
                raise ValueError(f"rope_parameters.rope_type: dynamic rescales past max_position_embeddings="
                                 f"{self.max_pos} (position {seq_len - 1} asked); not modelled")
            return self.inv_freq
        return self.rope.inv_freq(self.head_dim, self.max_pos, seq_len=seq_len)[0].to(self.inv_freq.device)

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self._inv_freq(position_ids)  # [B, S, rotary_dim/2], fp32
        emb = torch.cat([freqs, freqs], dim=-1)
        return (emb.cos() * self.attention_scaling).to(dtype), (emb.sin() * self.attention_scaling).to(dtype)

    def cache(self, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin tables [max_positions, rotary_dim/2] (fp32) for position p and frequency pair i: the
        half-width layout onnxruntime's GroupQueryAttention / RotaryEmbedding take as cos_cache / sin_cache
        (rotary_interleaved=0 is this rotate-half convention)."""
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * self.inv_freq
        return freqs.cos() * self.attention_scaling, freqs.sin() * self.attention_scaling


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last axis."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, S, D]; cos/sin [B, S, R]: the first R channels rotate (partial rotary when R < D), the rest pass."""
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return x * cos[:, None] + rotate_half(x) * sin[:, None]
    rot, rest = x[..., :r], x[..., r:]
    return torch.cat([rot * cos[:, None] + rotate_half(rot) * sin[:, None], rest], dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig, layer: int = 0) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.groups = self.num_heads // self.num_kv_heads
        self.fused = config.fused
        self.rotary = config.rotary_layer(layer)
        h, d = config.hidden_size, config.head_dim
        if self.fused:   # Phi-3's names: q|k|v in one Linear
            self.qkv_proj = nn.Linear(h, (self.num_heads + 2 * self.num_kv_heads) * d, bias=False)
        else:
            self.q_proj = nn.Linear(h, self.num_heads * d, bias=config.qkv_bias)
            self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=config.qkv_bias)
            self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=config.o_bias)
        if config.qk_norm:   # Qwen3: RMSNorm over each head's channels, before rotary
            self.q_norm = LlamaRMSNorm(d, config.rms_norm_eps)
            self.k_norm = LlamaRMSNorm(d, config.rms_norm_eps)
        self.attn_dropout = nn.Dropout(config.attention_dropout)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[B, S, heads, D] each for q, k, v."""
        b, s, _ = x.shape
        if self.fused:
            nq, nkv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
            q, k, v = self.qkv_proj(x).split([nq, nkv, nkv], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(b, s, self.num_heads, self.head_dim)
        k = k.view(b, s, self.num_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v.view(b, s, self.num_kv_heads, self.head_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, allowed: torch.Tensor,
                past: KV) -> tuple[torch.Tensor, KV]:
        """x [B, S, hidden]; allowed bool [B, 1, S, P+S]; past (k, v) each [B, kv_heads, P, D]."""
        b, s, _ = x.shape
        q, k, v = (t.transpose(1, 2) for t in self._qkv(x))
        if self.rotary:
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        k = torch.cat([past[0], k], dim=2)
        v = torch.cat([past[1], v], dim=2)
        # GQA: each kv head serves `groups` consecutive query heads (HF's repeat_kv layout).
        kr = k.repeat_interleave(self.groups, dim=1) if self.groups > 1 else k
        vr = v.repeat_interleave(self.groups, dim=1) if self.groups > 1 else v
        scores = torch.matmul(q, kr.transpose(-1, -2)) * (self.head_dim ** -0.5)
        # finfo.min, not -inf: a left-pad query that sees only padding gets a finite uniform row, not NaN.
        scores = torch.where(allowed, scores, torch.finfo(scores.dtype).min)
        probs = self.attn_dropout(torch.softmax(scores.float(), dim=-1).to(q.dtype))
        y = torch.matmul(probs, vr).transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim)
        return self.o_proj(y), (k, v)


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); Phi-3 holds gate|up in one Linear (gate_up_proj)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        if config.fused:
            self.gate_up_proj = nn.Linear(h, 2 * i, bias=False)
        else:
            self.gate_proj = nn.Linear(h, i, bias=config.mlp_bias)
            self.up_proj = nn.Linear(h, i, bias=config.mlp_bias)
        self.down_proj = nn.Linear(i, h, bias=config.mlp_bias and not config.fused)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "gate_up_proj"):
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, layer: int = 0) -> None:
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, allowed: torch.Tensor,
                past: KV) -> tuple[torch.Tensor, KV]:
        a, present = self.self_attn(self.input_layernorm(x), cos, sin, allowed, past)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), present


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config)


class LlamaForCausalLM(nn.Module):
    """Decoder + LM head (tied to embed_tokens when tie_word_embeddings)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        std = config.initializer_range
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=std)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def empty_past(self, batch: int, device: torch.device | None = None,
                   dtype: torch.dtype = torch.float32) -> list[KV]:
        """A past of length 0 for every layer ([B, kv_heads, 0, D])."""
        c = self.config
        z = torch.zeros(batch, c.num_key_value_heads, 0, c.head_dim, device=device, dtype=dtype)
        return [(z, z) for _ in range(c.num_hidden_layers)]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                past_key_values: list[KV] | None = None) -> tuple[torch.Tensor, list[KV]]:
        """input_ids [B, S]; attention_mask [B, P+S] (1 real, 0 pad); position_ids [B, S];
        past_key_values: per layer (k, v) each [B, kv_heads, P, head_dim] (keys already rotated).
        -> (logits [B, S, V], presents: per layer (k, v) each [B, kv_heads, P+S, head_dim])."""
        b, s = input_ids.shape
        m = self.model
        if past_key_values is None:
            past_key_values = self.empty_past(b, input_ids.device, m.embed_tokens.weight.dtype)
        p = past_key_values[0][0].shape[2]
        position_ids, allowed = cache_inputs(attention_mask, position_ids, b, s, p, input_ids.device)
        if self.config.sliding_window is not None:   # Phi-3: by cache column, as transformers' sliding mask
            cols = torch.arange(p + s, device=input_ids.device)
            allowed = allowed & (cols[None, :] > cols[p:, None] - self.config.sliding_window)

        x = m.embed_tokens(input_ids)
        cos, sin = m.rotary_emb(position_ids, x.dtype)
        presents: list[KV] = []
        for layer, past in zip(m.layers, past_key_values):
            x, present = layer(x, cos, sin, allowed, past)
            presents.append(present)
        return self.lm_head(m.norm(x)), presents
