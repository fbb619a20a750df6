"""T5 (and T5 v1.1 / Flan-T5's gated-GELU variant) with Hugging Face's parameter names, for loading HF T5
checkpoints into our seq2seq call convention (training/seq2seq.py).

What sets T5 apart from Marian/BART: pre-norm blocks with an RMS norm (`T5LayerNorm`: no mean, no bias) and
a final norm per stack; no biases anywhere; NO absolute positions: a learned bias per head and relative-
position bucket is added to the attention scores (the first block of each stack owns the table
`relative_attention_bias`; every block reuses the bias it computes), bidirectional buckets in the encoder,
causal ones in the decoder, none in cross-attention; scores are NOT scaled by 1/sqrt(d_kv); heads have their
own width `d_kv` (inner width num_heads * d_kv may differ from d_model). The feed-forward is relu
(`DenseReluDense.wi`, `.wo`) or gated (`wi_0` through the activation times `wi_1`; "gated-gelu" means tanh-GELU).
The head: tied to `shared` and fed decoder states scaled by d_model^-0.5, or (v1.1) its own `lm_head`
without the scaling. transformers 5 keeps the two apart as `tie_word_embeddings` (always true in its
configs; a checkpoint with a distinct lm_head is untied on load) and `scale_decoder_outputs`; ours keeps both.

The decoder starts from `decoder_start_token_id`, pad (0) unless the config says otherwise.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from training.bert import activation
from training.seq2seq import KV, attend, merge_heads, source_allowed, split_heads, target_allowed

ARCHITECTURE = "T5ForConditionalGeneration"


@dataclass
class T5Config:
    """T5 sizes under HF's config.json names; defaults are HF T5Config's (t5-small sized)."""

    vocab_size: int = 32128
    d_model: int = 512
    d_kv: int = 64
    d_ff: int = 2048
    num_layers: int = 6
    num_decoder_layers: int | None = None   # None: num_layers
    num_heads: int = 8
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    dropout_rate: float = 0.1
    layer_norm_epsilon: float = 1e-6
    initializer_factor: float = 1.0
    feed_forward_proj: str = "relu"         # relu | gelu | gated-gelu | gated-silu | ...
    tie_word_embeddings: bool = True
    scale_decoder_outputs: bool | None = None  # None: = tie_word_embeddings (HF's rule)
    pad_token_id: int = 0
    eos_token_id: int = 1
    decoder_start_token_id: int | None = None  # None: pad_token_id
    forced_eos_token_id: int | None = None
    forced_bos_token_id: int | None = None

    model_type = "t5"

    def __post_init__(self) -> None:
        if self.num_decoder_layers is None:
            self.num_decoder_layers = self.num_layers
        if self.scale_decoder_outputs is None:
            self.scale_decoder_outputs = self.tie_word_embeddings
        if self.decoder_start_token_id is None:
            self.decoder_start_token_id = self.pad_token_id
        parts = self.feed_forward_proj.split("-")
        if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
            raise ValueError(f"feed_forward_proj: expected ACT or gated-ACT, got {self.feed_forward_proj!r}")
        activation(self.dense_act_fn)
        if isinstance(self.eos_token_id, list):
            self.eos_token_id = self.eos_token_id[0]

    @property
    def is_gated_act(self) -> bool:
        return self.feed_forward_proj.startswith("gated-")

    @property
    def dense_act_fn(self) -> str:
        # HF: "gated-gelu" is the tanh approximation (gelu_new), as the original T5 v1.1 used.
        return "gelu_new" if self.feed_forward_proj == "gated-gelu" else self.feed_forward_proj.split("-")[-1]

    def to_hf_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(model_type=self.model_type, is_encoder_decoder=True, dense_act_fn=self.dense_act_fn,
                 is_gated_act=self.is_gated_act)
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "T5Config":
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if "scale_decoder_outputs" not in d:  # written by transformers < 5: the scale followed the tie
            kw["scale_decoder_outputs"] = d.get("tie_word_embeddings", True) is not False
        return cls(**kw)


class T5LayerNorm(nn.Module):
    """RMS norm without mean or bias, the variance in fp32 (HF's order)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon)).to(self.weight.dtype)


def relative_position_bucket(relative_position: torch.Tensor, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> torch.Tensor:
    """T5's bucket of key_pos - query_pos: half the buckets exact small distances, the rest logarithmic up
    to max_distance; bidirectional splits the buckets between keys before and after the query, causal maps
    every later key to bucket 0."""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = -torch.clamp(relative_position, max=0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    large = max_exact + (torch.log(distance.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).long()
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, large)


class T5Attention(nn.Module):
    def __init__(self, config: T5Config, has_relative_attention_bias: bool, bidirectional: bool) -> None:
        super().__init__()
        inner = config.num_heads * config.d_kv
        self.heads = config.num_heads
        self.bidirectional = bidirectional
        self.num_buckets = config.relative_attention_num_buckets
        self.max_distance = config.relative_attention_max_distance
        self.q = nn.Linear(config.d_model, inner, bias=False)
        self.k = nn.Linear(config.d_model, inner, bias=False)
        self.v = nn.Linear(config.d_model, inner, bias=False)
        self.o = nn.Linear(inner, config.d_model, bias=False)
        if has_relative_attention_bias:
            self.relative_attention_bias = nn.Embedding(config.relative_attention_num_buckets, config.num_heads)
        self.attn_dropout = nn.Dropout(config.dropout_rate)

    def compute_bias(self, query_length: int, key_length: int, past: int, device: torch.device) -> torch.Tensor:
        """[1, H, Q, K] for queries at past .. past+Q-1 and keys at 0 .. K-1."""
        q_pos = torch.arange(query_length, device=device)[:, None] + past
        k_pos = torch.arange(key_length, device=device)[None, :]
        bucket = relative_position_bucket(k_pos - q_pos, self.bidirectional, self.num_buckets, self.max_distance)
        return self.relative_attention_bias(bucket).permute(2, 0, 1)[None]

    def project_kv(self, states: torch.Tensor) -> KV:
        return split_heads(self.k(states), self.heads), split_heads(self.v(states), self.heads)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, kv: KV, bias: torch.Tensor | None) -> torch.Tensor:
        q = split_heads(self.q(x), self.heads)
        # T5 folds the 1/sqrt(d) into its initialisation: scores are not scaled.
        return self.o(merge_heads(attend(q, kv[0], kv[1], allowed, 1.0, bias, self.attn_dropout)))


class T5DenseActDense(nn.Module):
    def __init__(self, config: T5Config) -> None:
        super().__init__()
        self.wi = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.wo = nn.Linear(config.d_ff, config.d_model, bias=False)
        self.dropout = nn.Dropout(config.dropout_rate)
        self.act = activation(config.dense_act_fn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(self.dropout(self.act(self.wi(x))))


class T5DenseGatedActDense(nn.Module):
    def __init__(self, config: T5Config) -> None:
        super().__init__()
        self.wi_0 = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.wi_1 = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.wo = nn.Linear(config.d_ff, config.d_model, bias=False)
        self.dropout = nn.Dropout(config.dropout_rate)
        self.act = activation(config.dense_act_fn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(self.dropout(self.act(self.wi_0(x)) * self.wi_1(x)))


class T5LayerFF(nn.Module):
    def __init__(self, config: T5Config) -> None:
        super().__init__()
        self.DenseReluDense = T5DenseGatedActDense(config) if config.is_gated_act else T5DenseActDense(config)
        self.layer_norm = T5LayerNorm(config.d_model, config.layer_norm_epsilon)
        self.dropout = nn.Dropout(config.dropout_rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(self.DenseReluDense(self.layer_norm(x)))


class T5LayerSelfAttention(nn.Module):
    def __init__(self, config: T5Config, has_bias: bool, bidirectional: bool) -> None:
        super().__init__()
        self.SelfAttention = T5Attention(config, has_bias, bidirectional)
        self.layer_norm = T5LayerNorm(config.d_model, config.layer_norm_epsilon)
        self.dropout = nn.Dropout(config.dropout_rate)


class T5LayerCrossAttention(nn.Module):
    def __init__(self, config: T5Config) -> None:
        super().__init__()
        self.EncDecAttention = T5Attention(config, False, True)
        self.layer_norm = T5LayerNorm(config.d_model, config.layer_norm_epsilon)
        self.dropout = nn.Dropout(config.dropout_rate)


class T5Block(nn.Module):
    """layer[0] self-attention, layer[1] cross-attention (decoder only), layer[-1] feed-forward."""

    def __init__(self, config: T5Config, has_bias: bool, is_decoder: bool) -> None:
        super().__init__()
        parts: list[nn.Module] = [T5LayerSelfAttention(config, has_bias, bidirectional=not is_decoder)]
        if is_decoder:
            parts.append(T5LayerCrossAttention(config))
        parts.append(T5LayerFF(config))
        self.layer = nn.ModuleList(parts)


class T5Stack(nn.Module):
    def __init__(self, config: T5Config, embed_tokens: nn.Embedding, is_decoder: bool) -> None:
        super().__init__()
        n = config.num_decoder_layers if is_decoder else config.num_layers
        self.embed_tokens = embed_tokens
        self.block = nn.ModuleList(T5Block(config, i == 0, is_decoder) for i in range(int(n or 0)))
        self.final_layer_norm = T5LayerNorm(config.d_model, config.layer_norm_epsilon)
        self.dropout = nn.Dropout(config.dropout_rate)

    def position_bias(self, q: int, k: int, past: int, device: torch.device) -> torch.Tensor:
        return self.block[0].layer[0].SelfAttention.compute_bias(q, k, past, device)


class T5ForConditionalGeneration(nn.Module):
    def __init__(self, config: T5Config) -> None:
        super().__init__()
        self.config = config
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        self.encoder = T5Stack(config, self.shared, is_decoder=False)
        self.decoder = T5Stack(config, self.shared, is_decoder=True)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self._init_weights()
        self.tie_weights()

    def _init_weights(self) -> None:
        # HF T5's init (Mesh TensorFlow's): every matrix normal with std factor * fan_in^-0.5, embeddings std factor.
        f = self.config.initializer_factor
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, mean=0.0, std=f * m.in_features ** -0.5)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, mean=0.0, std=f)

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.shared.weight

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        enc = self.encoder
        b, s = input_ids.shape
        allowed = source_allowed(attention_mask, b, s, input_ids.device)
        bias = enc.position_bias(s, s, 0, input_ids.device)
        x = enc.dropout(enc.embed_tokens(input_ids))
        for block in enc.block:
            sa, ff = block.layer[0], block.layer[1]
            h = sa.layer_norm(x)
            x = x + sa.dropout(sa.SelfAttention(h, allowed, sa.SelfAttention.project_kv(h), bias))
            x = ff(x)
        return enc.dropout(enc.final_layer_norm(x))

    def cross_key_values(self, encoder_hidden_states: torch.Tensor) -> list[KV]:
        return [block.layer[1].EncDecAttention.project_kv(encoder_hidden_states) for block in self.decoder.block]

    def empty_past(self, batch: int, device: torch.device | None = None,
                   dtype: torch.dtype = torch.float32) -> list[KV]:
        c = self.config
        z = torch.zeros(batch, c.num_heads, 0, c.d_kv, device=device, dtype=dtype)
        return [(z, z) for _ in range(int(c.num_decoder_layers or 0))]

    def decode(self, decoder_input_ids: torch.Tensor, cross_key_values: list[KV],
               encoder_attention_mask: torch.Tensor | None = None, decoder_attention_mask: torch.Tensor | None = None,
               past_key_values: list[KV] | None = None) -> tuple[torch.Tensor, list[KV]]:
        dec = self.decoder
        b, t = decoder_input_ids.shape
        device = decoder_input_ids.device
        if past_key_values is None:
            past_key_values = self.empty_past(b, device, cross_key_values[0][0].dtype)
        p = past_key_values[0][0].shape[2]
        self_allowed = target_allowed(decoder_attention_mask, b, t, p, device)
        cross_allowed = source_allowed(encoder_attention_mask, b, cross_key_values[0][0].shape[2], device)
        bias = dec.position_bias(t, p + t, p, device)
        x = dec.dropout(dec.embed_tokens(decoder_input_ids))
        presents: list[KV] = []
        for block, past, cross in zip(dec.block, past_key_values, cross_key_values):
            sa, ca, ff = block.layer[0], block.layer[1], block.layer[2]
            h = sa.layer_norm(x)
            k, v = sa.SelfAttention.project_kv(h)
            present = (torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2))
            x = x + sa.dropout(sa.SelfAttention(h, self_allowed, present, bias))
            x = x + ca.dropout(ca.EncDecAttention(ca.layer_norm(x), cross_allowed, cross, None))
            x = ff(x)
            presents.append(present)
        x = dec.dropout(dec.final_layer_norm(x))
        if self.config.scale_decoder_outputs:
            x = x * (self.config.d_model ** -0.5)
        return self.lm_head(x), presents

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                decoder_input_ids: torch.Tensor, decoder_attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        cross = self.cross_key_values(self.encode(input_ids, attention_mask))
        return self.decode(decoder_input_ids, cross, attention_mask, decoder_attention_mask)[0]


def tied_keys(config: T5Config) -> set[str]:
    keys = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight"}
    if config.tie_word_embeddings:
        keys.add("lm_head.weight")
    return keys


# HF's T5 ignores this table if a file has it (cross-attention has no position bias).
_IGNORED = ("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",)


def normalise_hf_keys(sd: dict[str, torch.Tensor], config: T5Config) -> dict[str, torch.Tensor]:
    sd = {k: v for k, v in sd.items() if k not in _IGNORED}
    if "shared.weight" not in sd:
        for k in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
            if k in sd:
                sd = {**sd, "shared.weight": sd[k]}
                break
    return sd


def head_source_key(config: T5Config) -> str:
    return "shared.weight"
