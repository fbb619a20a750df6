"""The original Transformer ("Attention Is All You Need") as an encoder-decoder, in Hugging Face Marian's
layout and parameter names, so `transformers` loads our checkpoints as `MarianMTModel` and OPUS-MT / any HF
Marian checkpoint loads into ours.

Post-LayerNorm blocks (residual, then norm), fixed sinusoidal positions exactly as HF Marian builds them (sin
of every frequency in the first half of the dimensions, cos in the second half: not interleaved), token
embeddings scaled by sqrt(d_model) when `scale_embedding` (the paper does; OPUS-MT does), no embedding norm,
no final norm. `final_logits_bias` is a buffer added to the logits (zeros unless a checkpoint brings one).

Vocabularies: `share_encoder_decoder_embeddings` (HF's default) gives one `model.shared` table for both
sides; without it the encoder has `vocab_size` rows and the decoder and head `decoder_vocab_size` rows, i.e.
separate source and target vocabularies that HF Marian loads as well. `tie_word_embeddings` ties the head to
the decoder's table.

The config's defaults are HF MarianConfig's, because transformers writes only the keys that differ from its
defaults: a key missing from config.json means HF's default. Our own models set what they want explicitly.

Call convention: training/seq2seq.py (encode / cross_key_values / decode / forward).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from training.bert import activation
from training.seq2seq import (KV, attend, generate_greedy, merge_heads, source_allowed, split_heads,  # noqa: F401
                              target_allowed)
from training.weight_init import init_weights

ARCHITECTURE = "MarianMTModel"


@dataclass
class MarianConfig:
    """Marian sizes under HF's config.json names; defaults are HF MarianConfig's (opus-mt-en-de sized)."""

    vocab_size: int = 58101
    decoder_vocab_size: int | None = None   # None: vocab_size (one vocabulary)
    d_model: int = 1024
    encoder_layers: int = 12
    decoder_layers: int = 12
    encoder_attention_heads: int = 16
    decoder_attention_heads: int = 16
    encoder_ffn_dim: int = 4096
    decoder_ffn_dim: int = 4096
    max_position_embeddings: int = 1024
    activation_function: str = "gelu"
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    init_std: float = 0.02
    scale_embedding: bool = False
    share_encoder_decoder_embeddings: bool = True
    tie_word_embeddings: bool = True
    pad_token_id: int = 58100
    eos_token_id: int = 0
    bos_token_id: int | None = None
    decoder_start_token_id: int = 58100
    forced_eos_token_id: int | None = 0     # HF generate forces eos at the length limit; None: not
    forced_bos_token_id: int | None = None

    model_type = "marian"

    def __post_init__(self) -> None:
        if self.decoder_vocab_size is None:
            self.decoder_vocab_size = self.vocab_size
        if self.share_encoder_decoder_embeddings and self.decoder_vocab_size != self.vocab_size:
            raise ValueError(f"decoder_vocab_size: {self.decoder_vocab_size} differs from vocab_size {self.vocab_size} "
                             "but share_encoder_decoder_embeddings is true")
        for side in ("encoder", "decoder"):
            heads = getattr(self, f"{side}_attention_heads")
            if self.d_model % heads:
                raise ValueError(f"{side}_attention_heads: {heads} does not divide d_model={self.d_model}")
        activation(self.activation_function)
        for name in ("eos_token_id", "forced_eos_token_id"):
            value = getattr(self, name)
            if isinstance(value, list):  # HF allows several; the reference decoder uses the first
                setattr(self, name, value[0] if value else None)

    @property
    def target_vocab_size(self) -> int:
        return self.vocab_size if self.share_encoder_decoder_embeddings else int(self.decoder_vocab_size or 0)

    def to_hf_dict(self) -> dict[str, Any]:
        """config.json content (without architectures): every field written, so no HF default applies."""
        d = dataclasses.asdict(self)
        d.update(model_type=self.model_type, is_encoder_decoder=True, num_hidden_layers=self.encoder_layers)
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "MarianConfig":
        """Build from an HF Marian config dict (absent keys: HF's defaults); settings of older Marian configs
        that would change the computation are refused."""
        for key, ok in (("normalize_before", False), ("add_final_layer_norm", False), ("normalize_embedding", False),
                        ("static_position_embeddings", True), ("add_bias_logits", False)):
            if key in d and d[key] != ok:
                raise ValueError(f"{key}: only {ok} is supported for marian, got {d[key]!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def sinusoidal_table(n_pos: int, dim: int) -> torch.Tensor:
    """HF Marian's position table [n_pos, dim]: angle pos / 10000^(2*(j//2)/dim) for column j; sin of the even
    columns fills the first half, cos of the odd columns the second (an odd dim gives sin one more column)."""
    pos = torch.arange(n_pos, dtype=torch.float64)[:, None]
    j = torch.arange(dim, dtype=torch.float64)
    pair = torch.div(j, 2, rounding_mode="floor")
    angle = pos / torch.pow(torch.tensor(10000.0, dtype=torch.float64), 2 * pair / dim)
    sentinel = (dim + 1) // 2
    out = torch.empty(n_pos, dim, dtype=torch.float64)
    out[:, :sentinel] = torch.sin(angle[:, 0::2])
    out[:, sentinel:] = torch.cos(angle[:, 1::2])
    return out.float()


class MarianSinusoidalPositionalEmbedding(nn.Module):
    """Fixed positions: a non-persistent buffer, never saved (HF ignores it on load and save as well)."""

    def __init__(self, num_positions: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("weight", sinusoidal_table(num_positions, dim), persistent=False)

    def forward(self, start: int, length: int) -> torch.Tensor:
        """[length, dim] for positions start .. start+length-1."""
        if start + length > self.weight.shape[0]:
            raise ValueError(f"max_position_embeddings: position {start + length - 1} is past the table's "
                             f"{self.weight.shape[0]} positions")
        return self.weight[start:start + length]


class MarianAttention(nn.Module):
    """Multi-head attention with biased q/k/v/out projections (HF's names). Keys/values come in separately
    (`project_kv`) so decoder self-attention can append to its cache and cross-attention can reuse the
    encoder's keys/values for every step."""

    def __init__(self, d_model: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.scaling = (d_model // heads) ** -0.5
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.q_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.attn_dropout = nn.Dropout(dropout)

    def project_kv(self, states: torch.Tensor) -> KV:
        return split_heads(self.k_proj(states), self.heads), split_heads(self.v_proj(states), self.heads)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, kv: KV) -> torch.Tensor:
        q = split_heads(self.q_proj(x), self.heads)
        y = attend(q, kv[0], kv[1], allowed, self.scaling, dropout=self.attn_dropout)
        return self.out_proj(merge_heads(y))


class MarianEncoderLayer(nn.Module):
    def __init__(self, config: MarianConfig) -> None:
        super().__init__()
        d = config.d_model
        self.self_attn = MarianAttention(d, config.encoder_attention_heads, config.attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, config.encoder_ffn_dim)
        self.fc2 = nn.Linear(config.encoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)
        self.act = activation(config.activation_function)
        self.dropout = nn.Dropout(config.dropout)
        self.activation_dropout = nn.Dropout(config.activation_dropout)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        x = self.self_attn_layer_norm(x + self.dropout(self.self_attn(x, allowed, self.self_attn.project_kv(x))))
        h = self.fc2(self.activation_dropout(self.act(self.fc1(x))))
        return self.final_layer_norm(x + self.dropout(h))


class MarianDecoderLayer(nn.Module):
    def __init__(self, config: MarianConfig) -> None:
        super().__init__()
        d, heads = config.d_model, config.decoder_attention_heads
        self.self_attn = MarianAttention(d, heads, config.attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.encoder_attn = MarianAttention(d, heads, config.attention_dropout)
        self.encoder_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, config.decoder_ffn_dim)
        self.fc2 = nn.Linear(config.decoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)
        self.act = activation(config.activation_function)
        self.dropout = nn.Dropout(config.dropout)
        self.activation_dropout = nn.Dropout(config.activation_dropout)

    def forward(self, x: torch.Tensor, self_allowed: torch.Tensor, past: KV, cross: KV,
                cross_allowed: torch.Tensor) -> tuple[torch.Tensor, KV]:
        k, v = self.self_attn.project_kv(x)
        present = (torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2))
        x = self.self_attn_layer_norm(x + self.dropout(self.self_attn(x, self_allowed, present)))
        x = self.encoder_attn_layer_norm(x + self.dropout(self.encoder_attn(x, cross_allowed, cross)))
        h = self.fc2(self.activation_dropout(self.act(self.fc1(x))))
        return self.final_layer_norm(x + self.dropout(h)), present


class MarianEncoder(nn.Module):
    layer_class: type[nn.Module] = MarianEncoderLayer   # pre-norm families swap their blocks in (training/prenorm.py)

    def __init__(self, config: MarianConfig, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = embed_tokens
        self.embed_positions = MarianSinusoidalPositionalEmbedding(config.max_position_embeddings, config.d_model)
        self.layers = nn.ModuleList(self.layer_class(config) for _ in range(config.encoder_layers))
        self.dropout = nn.Dropout(config.dropout)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        # Source positions count from 0 in every row (right padding), as HF does.
        return self.embed_tokens(input_ids) * self.embed_scale + self.embed_positions(0, input_ids.shape[1])

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        b, s = input_ids.shape
        allowed = source_allowed(attention_mask, b, s, input_ids.device)
        x = self.dropout(self.embed(input_ids))
        for layer in self.layers:
            x = layer(x, allowed)
        return x


class MarianDecoder(nn.Module):
    layer_class: type[nn.Module] = MarianDecoderLayer

    def __init__(self, config: MarianConfig, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = embed_tokens
        self.embed_positions = MarianSinusoidalPositionalEmbedding(config.max_position_embeddings, config.d_model)
        self.layers = nn.ModuleList(self.layer_class(config) for _ in range(config.decoder_layers))
        self.dropout = nn.Dropout(config.dropout)

    def embed(self, ids: torch.Tensor, past: int) -> torch.Tensor:
        return self.embed_tokens(ids) * self.embed_scale + self.embed_positions(past, ids.shape[1])

    def forward(self, ids: torch.Tensor, cross: list[KV], encoder_attention_mask: torch.Tensor | None,
                decoder_attention_mask: torch.Tensor | None, past_key_values: list[KV]
                ) -> tuple[torch.Tensor, list[KV]]:
        b, t = ids.shape
        p = past_key_values[0][0].shape[2]
        self_allowed = target_allowed(decoder_attention_mask, b, t, p, ids.device)
        cross_allowed = source_allowed(encoder_attention_mask, b, cross[0][0].shape[2], ids.device)
        x = self.dropout(self.embed(ids, p))
        presents: list[KV] = []
        for layer, past, kv in zip(self.layers, past_key_values, cross):
            x, present = layer(x, self_allowed, past, kv, cross_allowed)
            presents.append(present)
        return x, presents


class MarianModel(nn.Module):
    def __init__(self, config: MarianConfig) -> None:
        super().__init__()
        d, pad = config.d_model, config.pad_token_id
        if config.share_encoder_decoder_embeddings:
            self.shared = nn.Embedding(config.vocab_size, d, padding_idx=pad)
            enc_emb = dec_emb = self.shared
        else:
            enc_emb = nn.Embedding(config.vocab_size, d, padding_idx=pad if pad < config.vocab_size else None)
            dec_emb = nn.Embedding(config.target_vocab_size, d, padding_idx=pad)
        self.encoder = MarianEncoder(config, enc_emb)
        self.decoder = MarianDecoder(config, dec_emb)


class EncoderDecoderLM(nn.Module):
    """The seq2seq call convention (training/seq2seq.py) over `self.model.encoder` / `self.model.decoder`
    and a head; Marian and BART share it."""

    config: Any
    model: Any
    lm_head: nn.Linear

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(x) + self.final_logits_bias

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.model.encoder(input_ids, attention_mask)

    def cross_key_values(self, encoder_hidden_states: torch.Tensor) -> list[KV]:
        return [layer.encoder_attn.project_kv(encoder_hidden_states) for layer in self.model.decoder.layers]

    def empty_past(self, batch: int, device: torch.device | None = None,
                   dtype: torch.dtype = torch.float32) -> list[KV]:
        """A self-attention past of length 0 for every decoder layer ([B, H, 0, D])."""
        c = self.config
        z = torch.zeros(batch, c.decoder_attention_heads, 0, c.d_model // c.decoder_attention_heads,
                        device=device, dtype=dtype)
        return [(z, z) for _ in range(c.decoder_layers)]

    def decode(self, decoder_input_ids: torch.Tensor, cross_key_values: list[KV],
               encoder_attention_mask: torch.Tensor | None = None, decoder_attention_mask: torch.Tensor | None = None,
               past_key_values: list[KV] | None = None) -> tuple[torch.Tensor, list[KV]]:
        if past_key_values is None:
            past_key_values = self.empty_past(decoder_input_ids.shape[0], decoder_input_ids.device,
                                              cross_key_values[0][0].dtype)
        x, presents = self.model.decoder(decoder_input_ids, cross_key_values, encoder_attention_mask,
                                         decoder_attention_mask, past_key_values)
        return self.head(x), presents

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                decoder_input_ids: torch.Tensor, decoder_attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Teacher-forced logits [B, T, V] (no cache returned)."""
        cross = self.cross_key_values(self.encode(input_ids, attention_mask))
        return self.decode(decoder_input_ids, cross, attention_mask, decoder_attention_mask)[0]


class MarianMTModel(EncoderDecoderLM):
    def __init__(self, config: MarianConfig) -> None:
        super().__init__()
        self.config = config
        self.model = MarianModel(config)
        self.lm_head = nn.Linear(config.d_model, config.target_vocab_size, bias=False)
        self.register_buffer("final_logits_bias", torch.zeros(1, config.target_vocab_size))
        init_encoder_decoder(self, config.init_std, config.d_model, config.scale_embedding)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.decoder.embed_tokens.weight


def init_encoder_decoder(model: nn.Module, std: float, d_model: int, scale_embedding: bool) -> None:
    """Fresh weights for training from scratch: Xavier-uniform projections and zero biases (the paper's
    setting, which trains post-LN blocks faster than HF's normal(0, 0.02)), unit LayerNorms, and token
    embeddings at std d_model^-0.5 when they are scaled by sqrt(d_model) (unit size after scaling, like the
    sinusoids they are added to), else `std`; the padding row zero."""
    embedding_std = d_model ** -0.5 if scale_embedding else std
    for m in model.modules():
        init_weights(m, embedding_std, linear_init=nn.init.xavier_uniform_)


# -------------------------------------------------------------------------------------------- checkpoint keys


def tied_keys(config: MarianConfig) -> set[str]:
    """Our state-dict keys that are views of another (never written; filled in on load)."""
    keys = set()
    if config.share_encoder_decoder_embeddings:
        keys |= {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"}
    if config.tie_word_embeddings:
        keys.add("lm_head.weight")
    return keys


def normalise_hf_keys(sd: dict[str, torch.Tensor], config: MarianConfig) -> dict[str, torch.Tensor]:
    """An HF Marian file's tensors -> ours: positions dropped (we compute the same table), the shared table
    taken from whichever copy the file has, a MarianModel file (no `model.` prefix) put under `model.`."""
    if not any(k.startswith("model.") for k in sd):
        sd = {(k if k in ("lm_head.weight", "final_logits_bias") else "model." + k): v for k, v in sd.items()}
    sd = {k: v for k, v in sd.items() if not k.endswith("embed_positions.weight")}
    if not config.share_encoder_decoder_embeddings:
        sd.pop("model.shared.weight", None)  # unused when each side has its own table
    if config.share_encoder_decoder_embeddings and "model.shared.weight" not in sd:
        for k in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
            if k in sd:
                sd["model.shared.weight"] = sd[k]
                break
    return sd


def resolve_sharing(config: MarianConfig, sd: dict[str, torch.Tensor]) -> str | None:
    """transformers 5 shares Marian's tables by tying them, and ties nothing when tie_word_embeddings is false:
    such a file carries an encoder and a decoder table of their own (and an unused `model.shared`). We load
    those as separate vocabularies (the same computation); returns what was changed, for the log."""
    if not config.share_encoder_decoder_embeddings:
        return None
    shared = sd.get("model.shared.weight")
    own = [sd.get(f"model.{side}.embed_tokens.weight") for side in ("encoder", "decoder")]
    if shared is None or any(t is None for t in own) or all(torch.equal(t, shared) for t in own if t is not None):
        return None
    config.share_encoder_decoder_embeddings = False
    config.decoder_vocab_size = config.vocab_size
    return "encoder/decoder embed_tokens differ from model.shared: loaded as separate tables"


def head_source_key(config: MarianConfig) -> str:
    """The table a tied head shares."""
    return "model.shared.weight" if config.share_encoder_decoder_embeddings else "model.decoder.embed_tokens.weight"
