"""What the engine needs to know about a decoder package, read from its typed manifest and checked against the
graph. The cache's shape is the manifest's CacheSpec itself; the rest is what generation reads per token."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

from modelpkg import CACHE_ELEMENT_TYPES, LAYOUT_INPLACE, CacheSpec, Manifest, past_names, present_names

# Packages exported before the in-place cache became the only one the engine runs.
CONCAT_REFUSAL = ("model.json cache.layout: 'concat' packages are no longer served (the engine runs the in-place "
                  "cache only); re-export the checkpoint: python -m export {checkpoint} --task generate")


@dataclass(frozen=True)
class DecoderSpec:
    cache: CacheSpec
    has_position_ids: bool   # the graph takes position_ids (learned positions); rotary graphs derive them
    max_length: int          # context: positions available to prompt + generated tokens
    vocab_size: int
    eos_id: int | None
    bos_id: int | None
    pad_id: int              # value fed at padding positions (masked, so any valid id works)
    past_dtype: type         # the cache's element type: float32, float16 (fp16 graphs), int8 (kv8)

    @property
    def num_layers(self) -> int:
        return self.cache.num_layers

    @property
    def num_kv_heads(self) -> int:
        return self.cache.kv_heads

    @property
    def head_dim(self) -> int:
        return self.cache.head_dim

    @property
    def past_names(self) -> list[str]:
        return past_names(self.cache.num_layers)

    @property
    def present_names(self) -> list[str]:
        return present_names(self.cache.num_layers)

    @classmethod
    def from_package(cls, manifest: Manifest, session: ort.InferenceSession) -> "DecoderSpec":
        """Raises ValueError naming the manifest field or graph input/output that does not fit."""
        cache = manifest.cache
        if cache is None:
            raise ValueError("model.json cache: a decoder package needs its cache description")
        if cache.layout != LAYOUT_INPLACE:
            raise ValueError(CONCAT_REFUSAL.format(checkpoint=manifest.source.get("checkpoint") or "<checkpoint dir>"))
        vocab = _positive("vocab_size", manifest.vocab_size)
        special = manifest.special_tokens
        eos, bos, pad = (_token(f"special_tokens.{k}", special.get(k), vocab) for k in ("eos", "bos", "pad"))
        return cls.of_graph(cache, session, max_length=_positive("max_length", manifest.max_length), vocab_size=vocab,
                            eos_id=eos, bos_id=bos, pad_id=next((t for t in (pad, eos, bos) if t is not None), 0))

    @classmethod
    def of_graph(cls, cache: CacheSpec, session: ort.InferenceSession, *, max_length: int, vocab_size: int,
                 eos_id: int | None, bos_id: int | None, pad_id: int) -> "DecoderSpec":
        """The spec of an in-place graph whose cache `cache` describes (a decoder's, or an encoder-decoder's
        decoder); ValueError naming the graph input or output that does not fit."""
        spec_inputs = {i.name: i for i in session.get_inputs()}
        spec_outputs = {o.name for o in session.get_outputs()}
        past = past_names(cache.num_layers)
        for name in ["input_ids", "attention_mask", *past]:
            if name not in spec_inputs:
                raise ValueError(f"model graph: input {name!r} missing (manifest cache.num_layers="
                                 f"{cache.num_layers}); inputs are {sorted(spec_inputs)}")
        for name in ["logits", *present_names(cache.num_layers)]:
            if name not in spec_outputs:
                raise ValueError(f"model graph: output {name!r} missing; outputs are {sorted(spec_outputs)}")
        dims = spec_inputs[past[0]].shape
        if len(dims) != 4 or dims[1] != cache.kv_heads or dims[3] != cache.head_dim:
            raise ValueError(f"model graph: input {past[0]!r} has shape {dims}, expected "
                             f"[batch, {cache.kv_heads}, max_sequence, {cache.head_dim}]")
        past_type = spec_inputs[past[0]].type
        # int8: the kv8 variant's cache (the graph quantizes on write, dequantizes on read; the engine only owns
        # the buffers); float16: the fp16 variant's.
        if past_type not in CACHE_ELEMENT_TYPES:
            raise ValueError(f"model graph: input {past[0]!r} has type {past_type}, expected float32, float16 or int8")
        return cls(cache=cache, has_position_ids="position_ids" in spec_inputs, max_length=max_length,
                   vocab_size=vocab_size, eos_id=eos_id, bos_id=bos_id, pad_id=pad_id,
                   past_dtype=np.dtype(CACHE_ELEMENT_TYPES[past_type]).type)


def _positive(field: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"model.json {field}: must be a positive integer, got {value!r}")
    return value


def _token(field: str, value: Any, vocab: int) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < vocab:
        raise ValueError(f"model.json {field}: must be a token id in [0, {vocab}) or null, got {value!r}")
    return value
