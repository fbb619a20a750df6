"""BART as an encoder-decoder with Hugging Face's parameter names, for loading HF BART checkpoints
(`BartForConditionalGeneration`, `BartModel`) into our seq2seq call convention (training/seq2seq.py).

BART's blocks are Marian's (post-LayerNorm, biased projections: the layers of training/marian.py, same
names); what differs is the embedding: LEARNED positions stored with an offset of 2 (position p reads row
p + 2 of `embed_positions.weight`, which has max_position_embeddings + 2 rows) and a LayerNorm over token +
position embeddings (`layernorm_embedding`) in both stacks. One shared vocabulary, head tied by default.

The config's defaults are HF BartConfig's (a key missing from config.json means HF's default).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from training.bert import activation
from training.marian import EncoderDecoderLM, MarianDecoder, MarianEncoder, init_encoder_decoder

ARCHITECTURE = "BartForConditionalGeneration"
POSITION_OFFSET = 2  # fairseq kept rows 0 and 1 for padding; HF keeps the layout


@dataclass
class BartConfig:
    """BART sizes under HF's config.json names; defaults are HF BartConfig's (bart-large sized)."""

    vocab_size: int = 50265
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
    tie_word_embeddings: bool = True
    pad_token_id: int = 1
    bos_token_id: int | None = 0
    eos_token_id: int = 2
    decoder_start_token_id: int = 2
    forced_eos_token_id: int | None = 2
    forced_bos_token_id: int | None = None

    model_type = "bart"

    def __post_init__(self) -> None:
        for side in ("encoder", "decoder"):
            heads = getattr(self, f"{side}_attention_heads")
            if self.d_model % heads:
                raise ValueError(f"{side}_attention_heads: {heads} does not divide d_model={self.d_model}")
        activation(self.activation_function)
        for name in ("eos_token_id", "forced_eos_token_id"):
            value = getattr(self, name)
            if isinstance(value, list):
                setattr(self, name, value[0] if value else None)

    def to_hf_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(model_type=self.model_type, is_encoder_decoder=True, num_hidden_layers=self.encoder_layers)
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "BartConfig":
        for key in ("normalize_before", "add_final_layer_norm"):  # mBART-style pre-norm stored as bart
            if d.get(key):
                raise ValueError(f"{key}: pre-LayerNorm BART variants are not supported, got {d[key]!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class BartLearnedPositionalEmbedding(nn.Embedding):
    def __init__(self, num_positions: int, dim: int) -> None:
        super().__init__(num_positions + POSITION_OFFSET, dim)

    def forward(self, start: int, length: int) -> torch.Tensor:  # type: ignore[override]
        """[length, dim] for positions start .. start+length-1."""
        if start + length + POSITION_OFFSET > self.weight.shape[0]:
            raise ValueError(f"max_position_embeddings: position {start + length - 1} is past the table's "
                             f"{self.weight.shape[0] - POSITION_OFFSET} positions")
        return self.weight[start + POSITION_OFFSET:start + length + POSITION_OFFSET]


class BartEncoder(MarianEncoder):
    def __init__(self, config: BartConfig, embed_tokens: nn.Embedding) -> None:
        super().__init__(config, embed_tokens)  # type: ignore[arg-type]
        self.embed_positions = BartLearnedPositionalEmbedding(config.max_position_embeddings, config.d_model)
        self.layernorm_embedding = nn.LayerNorm(config.d_model)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids) * self.embed_scale + self.embed_positions(0, input_ids.shape[1])
        return self.layernorm_embedding(x)


class BartDecoder(MarianDecoder):
    def __init__(self, config: BartConfig, embed_tokens: nn.Embedding) -> None:
        super().__init__(config, embed_tokens)  # type: ignore[arg-type]
        self.embed_positions = BartLearnedPositionalEmbedding(config.max_position_embeddings, config.d_model)
        self.layernorm_embedding = nn.LayerNorm(config.d_model)

    def embed(self, ids: torch.Tensor, past: int) -> torch.Tensor:
        x = self.embed_tokens(ids) * self.embed_scale + self.embed_positions(past, ids.shape[1])
        return self.layernorm_embedding(x)


class BartModel(nn.Module):
    encoder_class: type[nn.Module] = BartEncoder    # mBART (training/mbart.py) swaps in its pre-norm stacks
    decoder_class: type[nn.Module] = BartDecoder

    def __init__(self, config: BartConfig) -> None:
        super().__init__()
        self.shared = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.pad_token_id)
        self.encoder = self.encoder_class(config, self.shared)
        self.decoder = self.decoder_class(config, self.shared)


class BartForConditionalGeneration(EncoderDecoderLM):
    model_class: type[nn.Module] = BartModel
    has_logits_bias = True    # M2M100 (training/m2m100.py) has no final_logits_bias

    def __init__(self, config: BartConfig) -> None:
        super().__init__()
        self.config = config
        self.model = self.model_class(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if self.has_logits_bias:
            self.register_buffer("final_logits_bias", torch.zeros(1, config.vocab_size))
        init_encoder_decoder(self, config.init_std, config.d_model, config.scale_embedding)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.shared.weight


def tied_keys(config: BartConfig) -> set[str]:
    keys = {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"}
    if config.tie_word_embeddings:
        keys.add("lm_head.weight")
    return keys


def normalise_hf_keys(sd: dict[str, torch.Tensor], config: BartConfig) -> dict[str, torch.Tensor]:
    """A BartModel file (no `model.` prefix) goes under `model.`; the shared table from whichever copy exists."""
    if not any(k.startswith("model.") for k in sd):
        sd = {(k if k in ("lm_head.weight", "final_logits_bias") else "model." + k): v for k, v in sd.items()}
    if "model.shared.weight" not in sd:
        for k in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
            if k in sd:
                sd = {**sd, "model.shared.weight": sd[k]}
                break
    return sd


def resolve_sharing(config: BartConfig, sd: dict[str, torch.Tensor]) -> str | None:
    """transformers 5 writes separate encoder/decoder tables when tie_word_embeddings is false; our BART
    always shares one table, so such a file is refused rather than loaded wrong."""
    shared = sd.get("model.shared.weight")
    for side in ("encoder", "decoder"):
        own = sd.get(f"model.{side}.embed_tokens.weight")
        if shared is not None and own is not None and not torch.equal(own, shared):
            raise ValueError(f"tie_word_embeddings: model.{side}.embed_tokens differs from model.shared "
                             f"(separate {config.model_type} encoder and decoder tables are not supported)")
    return None


def head_source_key(config: BartConfig) -> str:
    return "model.shared.weight"

