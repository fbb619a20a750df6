"""model.json's `encoder_decoder` block: what a server needs to run an encoder-decoder package (Marian, BART, T5,
M2M100 / NLLB, mBART) without torch (docs/model-package.md, "Encoder-decoder packages").

Two graphs per variant: the encoder (input_ids, attention_mask [B, S] -> cross.{i}.key/value [B, heads, S,
head_dim]) runs once per request; the decoder runs every step over the in-place self cache (`cache` block,
layout "inplace") and reads the cross keys/values from a per-slot buffer [slots, heads, max_source_length,
head_dim], masked per row by `encoder_attention_mask`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .io_names import cross_names
from .manifest_types import ManifestError, TensorDecl, is_int, positive

SEQ2SEQ_FAMILIES = ("marian", "bart", "t5", "m2m_100", "mbart")
ENCODER_GRAPH, DECODER_GRAPH = "encoder", "decoder"
_KEYS = ("family", "num_layers", "num_heads", "head_dim", "model_head_dim", "max_source_length", "max_target_length",
         "decoder_start_token_id", "eos_token_id", "pad_token_id", "forced_bos_token_id", "forced_eos_token_id",
         "source_vocab_size", "target_vocab_size", "graphs", "target_tokenizer", "encoder_inputs", "encoder_outputs",
         "languages", "source_language", "source_language_index")


def _file_name(where: str, value: Any) -> str:
    if not (isinstance(value, str) and value and "/" not in value and "\\" not in value and value not in (".", "..")):
        raise ManifestError(f"model.json: {where} must be a file name in the package")
    return value


def _languages(value: Any, target_vocab: int) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and k and is_int(v) and 0 <= v < target_vocab
                                              for k, v in value.items()):
        raise ManifestError("model.json: encoder_decoder.languages must map language tokens to token ids below "
                            f"target_vocab_size ({target_vocab})")
    return {k: int(v) for k, v in value.items()}


def _source_language(d: dict, languages: dict[str, int]) -> dict[str, Any]:
    token, index = d.get("source_language"), d.get("source_language_index", 0)
    if token is None:
        return {}
    if token not in languages or not is_int(index):
        raise ManifestError("model.json: encoder_decoder.source_language must be one of encoder_decoder.languages, "
                            "with an integer source_language_index")
    return {"source_language": token, "source_language_index": int(index)}


@dataclass(frozen=True)
class Seq2SeqSpec:
    """The `encoder_decoder` block. Sizes are the decoder's: num_layers decoder layers (cross.{i}.*,
    past_key_values.{i}.*), num_heads, head_dim = every buffer's last axis (zero-padded to a multiple of 16 when
    the model's own head size, model_head_dim, is not one)."""

    family: str
    num_layers: int
    num_heads: int
    head_dim: int
    max_source_length: int            # the encoder's longest source (tokens, eos included) = cross buffer width
    max_target_length: int            # the self cache's length (decoder start token included)
    decoder_start_token_id: int
    eos_token_id: int
    pad_token_id: int
    source_vocab_size: int
    target_vocab_size: int            # the logits' width
    graphs: Mapping[str, Mapping[str, str]]   # variant -> {"encoder": file, "decoder": file}
    encoder_inputs: tuple[TensorDecl, ...] = ()
    encoder_outputs: tuple[TensorDecl, ...] = ()
    model_head_dim: int | None = None         # None: head_dim (not padded)
    forced_bos_token_id: int | None = None    # transformers' generate: forced as the first new token
    forced_eos_token_id: int | None = None    # ... and as the last one when max_new_tokens is reached
    target_tokenizer: str | None = None       # None: tokenizer.json decodes the target too (shared vocabulary)
    # Translation models: language token ("fra_Latn", "__fr__", "fr_XX") -> its id, what a request's
    # target_language may name (the token forced as the first generated one). Empty: the model takes none.
    languages: Mapping[str, int] = field(default_factory=dict)
    # The language token the tokenizer puts around every source (one of `languages`) and its index in the source
    # ids (negative: from the end), which a request's source_language replaces. None: sources carry no language.
    source_language: str | None = None
    source_language_index: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def real_head_dim(self) -> int:
        return self.head_dim if self.model_head_dim is None else self.model_head_dim

    @property
    def cross_names(self) -> list[str]:
        """[cross.0.key, cross.0.value, ...]: the encoder's outputs and the decoder's inputs, in this order."""
        return cross_names(self.num_layers)

    def cross_buffer_shape(self, slots: int) -> tuple[int, int, int, int]:
        return (slots, self.num_heads, self.max_source_length, self.head_dim)

    def self_cache_shape(self, slots: int) -> tuple[int, int, int, int]:
        return (slots, self.num_heads, self.max_target_length, self.head_dim)

    def encoder_file(self, variant: str) -> str:
        return self.graphs[variant][ENCODER_GRAPH]

    def decoder_file(self, variant: str) -> str:
        return self.graphs[variant][DECODER_GRAPH]

    @classmethod
    def from_dict(cls, d: Any) -> "Seq2SeqSpec":
        if not isinstance(d, dict):
            raise ManifestError("model.json: encoder_decoder must be an object")
        family = d.get("family")
        if family not in SEQ2SEQ_FAMILIES:
            raise ManifestError(f"model.json: encoder_decoder.family must be one of {', '.join(SEQ2SEQ_FAMILIES)}, "
                                f"got {family!r}")
        sizes = {k: positive(f"encoder_decoder.{k}", d.get(k))
                 for k in ("num_layers", "num_heads", "head_dim", "max_source_length", "max_target_length",
                           "source_vocab_size", "target_vocab_size")}
        model_head_dim = d.get("model_head_dim")
        if model_head_dim is not None:
            model_head_dim = positive("encoder_decoder.model_head_dim", model_head_dim)
            if model_head_dim > sizes["head_dim"]:
                raise ManifestError(f"model.json: encoder_decoder.model_head_dim ({model_head_dim}) exceeds "
                                    f"encoder_decoder.head_dim ({sizes['head_dim']})")
        tokens: dict[str, int | None] = {}
        for k in ("decoder_start_token_id", "eos_token_id", "pad_token_id", "forced_bos_token_id",
                  "forced_eos_token_id"):
            value = d.get(k)
            if value is None and k.startswith("forced_"):
                tokens[k] = None
                continue
            if not is_int(value) or not 0 <= value < sizes["target_vocab_size"]:
                raise ManifestError(f"model.json: encoder_decoder.{k} must be a token id below target_vocab_size "
                                    f"({sizes['target_vocab_size']}), got {value!r}")
            tokens[k] = int(value)
        graphs = d.get("graphs")
        if not isinstance(graphs, dict) or not graphs:
            raise ManifestError("model.json: encoder_decoder.graphs must map variants to {encoder, decoder} files")
        parsed: dict[str, dict[str, str]] = {}
        for variant, pair in graphs.items():
            if not isinstance(pair, dict):
                raise ManifestError(f"model.json: encoder_decoder.graphs.{variant} must be {{encoder, decoder}}")
            parsed[variant] = {k: _file_name(f"encoder_decoder.graphs.{variant}.{k}", pair.get(k))
                               for k in (ENCODER_GRAPH, DECODER_GRAPH)}
        target_tokenizer = d.get("target_tokenizer")
        if target_tokenizer is not None:
            target_tokenizer = _file_name("encoder_decoder.target_tokenizer", target_tokenizer)
        languages = _languages(d.get("languages"), sizes["target_vocab_size"])
        decls = {}
        for key in ("encoder_inputs", "encoder_outputs"):
            try:
                decls[key] = tuple(TensorDecl.from_dict(e) for e in d.get(key) or [])
            except ValueError:
                raise ManifestError(f"model.json: encoder_decoder.{key} must be a list of {{name, dtype, shape}}") \
                    from None
        return cls(family=family, **sizes, **tokens, graphs=parsed, model_head_dim=model_head_dim,
                   target_tokenizer=target_tokenizer, **decls,
                   languages=languages, **_source_language(d, languages),
                   extra={k: v for k, v in d.items() if k not in _KEYS})

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "family": self.family, "num_layers": self.num_layers, "num_heads": self.num_heads,
            "head_dim": self.head_dim, "model_head_dim": self.model_head_dim,
            "max_source_length": self.max_source_length, "max_target_length": self.max_target_length,
            "decoder_start_token_id": self.decoder_start_token_id, "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id, "forced_bos_token_id": self.forced_bos_token_id,
            "forced_eos_token_id": self.forced_eos_token_id, "source_vocab_size": self.source_vocab_size,
            "target_vocab_size": self.target_vocab_size, "graphs": {v: dict(p) for v, p in self.graphs.items()},
            "target_tokenizer": self.target_tokenizer,
            "encoder_inputs": [t.to_dict() for t in self.encoder_inputs],
            "encoder_outputs": [t.to_dict() for t in self.encoder_outputs],
        }
        if self.languages:
            out["languages"] = dict(self.languages)
        if self.source_language is not None:
            out.update(source_language=self.source_language, source_language_index=self.source_language_index)
        return {**out, **self.extra}
