"""M2M100 (and NLLB-200, the same architecture under model_type "m2m_100") as an encoder-decoder with Hugging Face's
parameter names, so HF `M2M100ForConditionalGeneration` checkpoints load into our seq2seq call convention
(training/seq2seq.py) and ours load into `transformers`.

What differs from BART (training/bart.py):
  - pre-LayerNorm blocks and a final `layer_norm` per stack (training/prenorm.py), no `layernorm_embedding`;
  - fixed sinusoidal positions (fairseq's: sin of every frequency in the first half of the dimensions, cos in the
    second, frequencies 10000^(-i / (half - 1))), counted from the NON-PAD tokens: position p of a real token reads
    row pad + 1 + p, a pad token reads row pad, which is zeros. With a cache, the new tokens count on from the past
    length: row (past + number of non-pad new tokens so far) + pad, as HF computes it;
  - token embeddings scaled by sqrt(d_model) (`scale_embedding`, true by default), ReLU, no `final_logits_bias`.
One shared vocabulary (`model.shared`), head tied by default. Layer drop (`encoder_layerdrop`) is a training-time
regulariser that is not implemented here: the key is not read. The config's defaults are HF M2M100Config's.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

# The kind's checkpoint-key rules are BART's (training/checkpoint.py reads them from this module).
from training.bart import (BartConfig, BartForConditionalGeneration, BartModel, head_source_key,  # noqa: F401
                           resolve_sharing, tied_keys)
from training.bart import normalise_hf_keys as _bart_keys
from training.marian import MarianDecoder, MarianEncoder
from training.prenorm import PreNormDecoderStack, PreNormEncoderStack

ARCHITECTURE = "M2M100ForConditionalGeneration"
TABLE_OFFSET = 2   # HF builds max_position_embeddings + 2 rows (and more on demand)


@dataclass
class M2M100Config(BartConfig):
    """M2M100 / NLLB sizes under HF's config.json names; defaults are HF M2M100Config's (m2m100_418M sized)."""

    vocab_size: int = 128112
    activation_function: str = "relu"
    attention_dropout: float = 0.1
    scale_embedding: bool = True
    forced_eos_token_id: int | None = None

    model_type = "m2m_100"

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "M2M100Config":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def sinusoidal_table(rows: int, dim: int, padding_idx: int | None) -> torch.Tensor:
    """fairseq's table [rows, dim] as HF M2M100 builds it (float32 arithmetic, so the values are the same bits):
    column i < dim // 2 is sin(row * f_i), column dim // 2 + i is cos(row * f_i), f_i = 10000^(-i / (half - 1));
    an odd dim gets a zero last column; the padding row is zeros."""
    half = dim // 2
    freq = torch.exp(torch.arange(half, dtype=torch.int64).float() * -(math.log(10000) / (half - 1)))
    angle = torch.arange(rows, dtype=torch.int64).float()[:, None] * freq[None, :]
    table = torch.cat([torch.sin(angle), torch.cos(angle), torch.zeros(rows, dim - 2 * half)], dim=1)
    if padding_idx is not None:
        table[padding_idx] = 0
    return table


def position_rows(ids: torch.Tensor, padding_idx: int, past: int = 0) -> torch.Tensor:
    """The table row of each token [B, T]: (past + non-pad tokens up to and including it) + pad for a real token,
    pad for a pad token."""
    real = ids.ne(padding_idx).long()
    return (torch.cumsum(real, dim=1) + past) * real + padding_idx


class M2M100SinusoidalPositionalEmbedding(nn.Module):
    """Fixed positions: a non-persistent buffer (never saved, as in HF), grown when a longer sequence comes."""

    def __init__(self, num_positions: int, dim: int, padding_idx: int) -> None:
        super().__init__()
        self.dim, self.padding_idx = dim, padding_idx
        self.register_buffer("weight", sinusoidal_table(num_positions + TABLE_OFFSET, dim, padding_idx),
                             persistent=False)

    def forward(self, ids: torch.Tensor, past: int) -> torch.Tensor:  # type: ignore[override]
        rows = position_rows(ids, self.padding_idx, past)
        need = self.padding_idx + 1 + ids.shape[1] + past
        if need > self.weight.shape[0]:
            self.weight = sinusoidal_table(need + TABLE_OFFSET, self.dim, self.padding_idx).to(self.weight.device)
        return self.weight[rows]


class M2M100Encoder(PreNormEncoderStack, MarianEncoder):
    def __init__(self, config: M2M100Config, embed_tokens: nn.Embedding) -> None:
        super().__init__(config, embed_tokens)
        self.embed_positions = M2M100SinusoidalPositionalEmbedding(config.max_position_embeddings, config.d_model,
                                                                   config.pad_token_id)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids) * self.embed_scale + self.embed_positions(input_ids, 0)


class M2M100Decoder(PreNormDecoderStack, MarianDecoder):
    def __init__(self, config: M2M100Config, embed_tokens: nn.Embedding) -> None:
        super().__init__(config, embed_tokens)
        self.embed_positions = M2M100SinusoidalPositionalEmbedding(config.max_position_embeddings, config.d_model,
                                                                   config.pad_token_id)

    def embed(self, ids: torch.Tensor, past: int) -> torch.Tensor:
        return self.embed_tokens(ids) * self.embed_scale + self.embed_positions(ids, past)


class M2M100Model(BartModel):
    encoder_class = M2M100Encoder
    decoder_class = M2M100Decoder


class M2M100ForConditionalGeneration(BartForConditionalGeneration):
    model_class = M2M100Model
    has_logits_bias = False

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(x)


def normalise_hf_keys(sd: dict[str, torch.Tensor], config: M2M100Config) -> dict[str, torch.Tensor]:
    """BART's rules; fairseq-converted files may still carry the position table's placeholder, which we compute."""
    sd = _bart_keys(sd, config)
    return {k: v for k, v in sd.items() if ".embed_positions." not in k}
