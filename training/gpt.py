"""GPT-2 decoder with a key/value cache and Hugging Face parameter names.

Layers are nn.Linear inside; HF stores GPT-2's Conv1D weights as [in, out], so checkpoint.py
transposes c_attn / c_proj / c_fc weights on load and save.

The attention mask is built explicitly over absolute positions (causal AND padding) so that one
code path serves the prompt (past length 0) and each cached decoding step, and exports to ONNX.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from training.bert import activation
from training.weight_init import init_weights

log = logging.getLogger(__name__)

KV = tuple[torch.Tensor, torch.Tensor]

_PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(n_layer=2, n_embd=64, n_head=2, n_positions=128),
    "small": dict(n_layer=4, n_embd=256, n_head=4, n_positions=256),
    "base": dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024),
}


@dataclass
class GPTConfig:
    """GPT-2 sizes under Hugging Face's config.json names."""

    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None  # None = 4 * n_embd
    activation_function: str = "gelu_new"
    resid_pdrop: float = 0.1
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd: {self.n_embd} is not a multiple of n_head={self.n_head}")
        activation(self.activation_function)

    @property
    def inner_size(self) -> int:
        return self.n_inner if self.n_inner is not None else 4 * self.n_embd

    @classmethod
    def preset(cls, name: str, vocab_size: int, **overrides: Any) -> "GPTConfig":
        """`tiny` / `small` / `base` sizes; any other field can be overridden."""
        if name not in _PRESETS:
            raise ValueError(f"preset: unknown GPT preset {name!r} (one of {sorted(_PRESETS)})")
        return cls(vocab_size=vocab_size, **{**_PRESETS[name], **overrides})

    def to_hf_dict(self) -> dict[str, Any]:
        """config.json content (without architectures)."""
        d = dataclasses.asdict(self)
        d["model_type"] = "gpt2"
        d["n_ctx"] = self.n_positions
        d["tie_word_embeddings"] = True
        d["scale_attn_weights"] = True
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "GPTConfig":
        """Build from an HF GPT-2 config dict; keys we do not model are ignored."""
        for key, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                        ("reorder_and_upcast_attn", False)):
            if d.get(key, ok) != ok:
                raise ValueError(f"{key}: only {ok} is supported, got {d[key]!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def cache_inputs(attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None, b: int, s: int, p: int,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(position_ids [B, S], allowed [B, 1, S, P+S]) for S new tokens after a past of P: positions count only
    real tokens (left padding starts every row at 0); a query sees keys at absolute positions up to its own,
    never padding. Shared by every decoder family here."""
    if attention_mask is None:
        attention_mask = torch.ones(b, p + s, dtype=torch.long, device=device)
    if position_ids is None:
        position_ids = (torch.cumsum(attention_mask.long(), dim=-1) - 1).clamp(min=0)[:, -s:]
    q_pos = torch.arange(s, device=device) + p
    k_pos = torch.arange(p + s, device=device)
    causal = k_pos[None, :] <= q_pos[:, None]                                  # [S, P+S]
    return position_ids, causal[None, None] & attention_mask[:, None, None, :].bool()


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.head_dim = config.n_embd // config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, past: KV) -> tuple[torch.Tensor, KV]:
        """x [B, S, C]; allowed bool [B, 1, S, P+S]; past (k, v) each [B, H, P, D]."""
        b, s, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, s, self.n_head, self.head_dim).transpose(1, 2)
        k = torch.cat([past[0], k.view(b, s, self.n_head, self.head_dim).transpose(1, 2)], dim=2)
        v = torch.cat([past[1], v.view(b, s, self.n_head, self.head_dim).transpose(1, 2)], dim=2)
        scores = torch.matmul(q, k.transpose(-1, -2)) * (self.head_dim ** -0.5)
        # finfo.min, not -inf: a left-pad query that sees only padding gets a finite uniform row, not NaN.
        scores = torch.where(allowed, scores, torch.finfo(scores.dtype).min)
        probs = self.attn_dropout(torch.softmax(scores, dim=-1))
        y = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, c)
        return self.resid_dropout(self.c_proj(y)), (k, v)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.inner_size)
        self.c_proj = nn.Linear(config.inner_size, config.n_embd)
        self.act = activation(config.activation_function)
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LN block."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, past: KV) -> tuple[torch.Tensor, KV]:
        a, present = self.attn(self.ln_1(x), allowed, past)
        x = x + a
        return x + self.mlp(self.ln_2(x)), present


class GPT2Model(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)


class GPT2LMHeadModel(nn.Module):
    """GPT-2 with the LM head tied to the token embeddings."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = GPT2Model(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.apply(lambda m: init_weights(m, config.initializer_range))
        # GPT-2's scaled init of the residual projections (as HF does).
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=config.initializer_range / (2 * config.n_layer) ** 0.5)
        self.tie_weights()

    def tie_weights(self) -> None:
        self.lm_head.weight = self.transformer.wte.weight

    def empty_past(self, batch: int, device: torch.device | None = None,
                   dtype: torch.dtype = torch.float32) -> list[KV]:
        """A past of length 0 for every layer ([B, H, 0, D])."""
        c = self.config
        z = torch.zeros(batch, c.n_head, 0, c.n_embd // c.n_head, device=device, dtype=dtype)
        return [(z, z) for _ in range(c.n_layer)]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                past_key_values: list[KV] | None = None) -> tuple[torch.Tensor, list[KV]]:
        """input_ids [B, S]; attention_mask [B, P+S] (1 real, 0 pad); position_ids [B, S];
        past_key_values: per layer (k, v) each [B, H, P, D].
        -> (logits [B, S, V], presents: per layer (k, v) each [B, H, P+S, D])."""
        b, s = input_ids.shape
        tr = self.transformer
        if past_key_values is None:
            past_key_values = self.empty_past(b, input_ids.device, tr.wte.weight.dtype)
        p = past_key_values[0][0].shape[2]
        position_ids, allowed = cache_inputs(attention_mask, position_ids, b, s, p, input_ids.device)

        x = tr.drop(tr.wte(input_ids) + tr.wpe(position_ids))
        presents: list[KV] = []
        for block, past in zip(tr.h, past_key_values):
            x, present = block(x, allowed, past)
            presents.append(present)
        return self.lm_head(tr.ln_f(x)), presents


@torch.no_grad()
def generate_greedy(model: GPT2LMHeadModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                    max_new_tokens: int, eos_token_id: int | None = None) -> torch.Tensor:
    """Reference greedy decoding with the cache. Returns the new ids [B, N] (N ≤ max_new_tokens:
    stops early once every row has produced eos; a finished row keeps emitting eos)."""
    b = input_ids.shape[0]
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    logits, past = model(input_ids, attention_mask)
    finished = torch.zeros(b, dtype=torch.bool, device=input_ids.device)
    out: list[torch.Tensor] = []
    for step in range(max_new_tokens):
        nxt = logits[:, -1].argmax(dim=-1)
        if eos_token_id is not None:
            nxt = torch.where(finished, torch.full_like(nxt, eos_token_id), nxt)
            finished |= nxt == eos_token_id
        out.append(nxt)
        if (eos_token_id is not None and bool(finished.all())) or step == max_new_tokens - 1:
            break
        attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
        logits, past = model(nxt[:, None], attention_mask, past_key_values=past)
    if not out:
        return input_ids.new_zeros((b, 0))
    return torch.stack(out, dim=1)
