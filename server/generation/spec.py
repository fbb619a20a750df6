"""What the engine needs to know about a decoder package, read from model.json and checked against the graph."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

from modelpkg import CACHE_ELEMENT_TYPES, CacheSpec, past_names, present_names


@dataclass(frozen=True)
class DecoderSpec:
    num_layers: int
    num_heads: int
    head_dim: int
    num_kv_heads: int        # == num_heads unless the model uses grouped-query attention
    layout: str              # "concat": the graph returns past + new; "inplace": one shared buffer per layer
    has_position_ids: bool   # the graph takes position_ids (learned positions); rotary graphs derive them
    max_length: int          # context: positions available to prompt + generated tokens
    vocab_size: int
    eos_id: int | None
    bos_id: int | None
    pad_id: int              # value fed at left-padding positions (masked, so any valid id works)
    past_dtype: type

    @property
    def past_names(self) -> list[str]:
        return past_names(self.num_layers)

    @property
    def present_names(self) -> list[str]:
        return present_names(self.num_layers)

    @classmethod
    def from_package(cls, manifest: dict[str, Any], session: ort.InferenceSession) -> "DecoderSpec":
        """Raises ValueError naming the manifest field or graph input/output that does not fit."""
        cache = CacheSpec.from_dict(manifest.get("cache"))   # the package contract's rules (ValueError naming the field)
        sizes = {"num_layers": cache.num_layers, "num_heads": cache.num_heads, "head_dim": cache.head_dim}
        max_length = _positive("max_length", manifest.get("max_length"))
        vocab = _positive("vocab_size", manifest.get("vocab_size"))
        special = manifest.get("special_tokens") or {}
        eos, bos, pad = (_token(f"special_tokens.{k}", special.get(k), vocab) for k in ("eos", "bos", "pad"))
        spec_inputs = {i.name: i for i in session.get_inputs()}
        spec_outputs = {o.name for o in session.get_outputs()}
        past = past_names(sizes["num_layers"])
        for name in ["input_ids", "attention_mask", *past]:
            if name not in spec_inputs:
                raise ValueError(f"model graph: input {name!r} missing (manifest cache.num_layers="
                                 f"{sizes['num_layers']}); inputs are {sorted(spec_inputs)}")
        present = present_names(sizes["num_layers"])
        for name in ["logits", *present]:
            if name not in spec_outputs:
                raise ValueError(f"model graph: output {name!r} missing; outputs are {sorted(spec_outputs)}")
        layout, kv_heads = cache.layout, cache.kv_heads
        if layout == "inplace":
            dims = spec_inputs[past[0]].shape
            if len(dims) != 4 or dims[1] != kv_heads or dims[3] != sizes["head_dim"]:
                raise ValueError(f"model graph: input {past[0]!r} has shape {dims}, expected "
                                 f"[batch, {kv_heads}, max_sequence, {sizes['head_dim']}]")
        elif "position_ids" not in spec_inputs:
            raise ValueError(f"model graph: input 'position_ids' missing; inputs are {sorted(spec_inputs)}")
        past_type = spec_inputs[past[0]].type
        # int8: the kv8 variant's cache (the graph quantizes on write, dequantizes on read; the engine only owns
        # the buffers), written in place only.
        if past_type not in CACHE_ELEMENT_TYPES or (past_type == "tensor(int8)" and layout != "inplace"):
            raise ValueError(f"model graph: input {past[0]!r} has type {past_type}, expected float32 or float16 "
                             "(or int8 with the in-place cache)")
        return cls(num_layers=sizes["num_layers"], num_heads=sizes["num_heads"], head_dim=sizes["head_dim"],
                   num_kv_heads=kv_heads, layout=layout, has_position_ids="position_ids" in spec_inputs,
                   max_length=max_length, vocab_size=vocab, eos_id=eos, bos_id=bos,
                   pad_id=next((t for t in (pad, eos, bos) if t is not None), 0),
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
