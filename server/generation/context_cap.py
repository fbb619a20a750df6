"""The served context cap (--max-model-len): a generation model's cache slots hold at most this many positions.

Every slot is allocated at load for the whole context, [kv_heads, max_length, head_dim] per layer and kind, so the
context decides the cache's memory (docs/configuration.md). The cap may shorten a package's context, never lengthen
it: the graph's position tables end at the package's max_length."""
from __future__ import annotations

from dataclasses import replace

from .spec import DecoderSpec


def cap_context(spec: DecoderSpec, cap: int, field: str) -> DecoderSpec:
    """The spec with max_length = cap (0: unchanged); ValueError naming the flag when cap is past the package's
    context (`field`, the model.json field it comes from)."""
    if not cap or cap == spec.max_length:
        return spec
    if cap > spec.max_length:
        raise ValueError(f"--max-model-len: {cap} exceeds the package's context of {spec.max_length} tokens "
                         f"({field}); lower it, or re-export with python -m export --max-length")
    return replace(spec, max_length=cap)

