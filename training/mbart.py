"""mBART (mbart-large-cc25, mBART-50) as an encoder-decoder with Hugging Face's parameter names, so HF
`MBartForConditionalGeneration` checkpoints load into our seq2seq call convention (training/seq2seq.py) and ours
load into `transformers`.

BART's embeddings (training/bart.py: learned positions stored with an offset of 2, `layernorm_embedding` over token
+ position embeddings, `final_logits_bias`) with pre-LayerNorm blocks and a final `layer_norm` per stack
(training/prenorm.py). Embeddings scaled by sqrt(d_model) when `scale_embedding` (false by HF's default, true in
the released checkpoints' configs). The fairseq keys `normalize_before` / `add_final_layer_norm` that old configs
carry are ignored, as transformers ignores them (its mBART is always pre-norm). The config's defaults are HF
MBartConfig's; a missing `decoder_start_token_id` is `bos_token_id`, as transformers' generate falls back to it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from training.bart import (BartConfig, BartDecoder, BartEncoder, BartForConditionalGeneration, BartModel,
                           head_source_key, normalise_hf_keys, resolve_sharing, tied_keys)  # noqa: F401
from training.prenorm import PreNormDecoderStack, PreNormEncoderStack

ARCHITECTURE = "MBartForConditionalGeneration"


@dataclass
class MBartConfig(BartConfig):
    """mBART sizes under HF's config.json names; defaults are HF MBartConfig's."""

    decoder_start_token_id: int | None = None    # None: bos_token_id (set in __post_init__)

    model_type = "mbart"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.decoder_start_token_id is None:
            if self.bos_token_id is None:
                raise ValueError("decoder_start_token_id: not set, and no bos_token_id to start from")
            self.decoder_start_token_id = self.bos_token_id

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "MBartConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class MBartEncoder(PreNormEncoderStack, BartEncoder):
    pass


class MBartDecoder(PreNormDecoderStack, BartDecoder):
    pass


class MBartModel(BartModel):
    encoder_class = MBartEncoder
    decoder_class = MBartDecoder


class MBartForConditionalGeneration(BartForConditionalGeneration):
    model_class = MBartModel
