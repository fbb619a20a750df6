"""Padded attention heads: where a model's head channels sit in a cache whose head size was rounded up.

onnxruntime's CPU GroupQueryAttention takes head sizes that are multiples of 16 only. A model with another head
size is exported with each head widened by zero channels (export/decoder_graph.py); the cache tensor then has
the padded size (`cache.head_dim`) and the model's own size is `cache.model_head_dim`.

The model's channels are split in two halves and each half starts its half of the padded head: rotary
position embedding (rotate-half form) pairs channel j with channel j + head_dim / 2, so a real pair (i, i + d/2)
must land on (i, i + head_dim / 2). Families without rotary use the same placement, so one rule describes
every padded cache.
"""
from __future__ import annotations

HEAD_MULTIPLE = 16   # onnxruntime's CPU GroupQueryAttention: "head_size shall be a multiple of 16"


def padded_head_dim(model_head_dim: int, multiple: int = HEAD_MULTIPLE) -> int:
    """The smallest multiple of `multiple` that holds `model_head_dim` channels."""
    return -(-model_head_dim // multiple) * multiple


def head_channels(model_head_dim: int, head_dim: int) -> list[int]:
    """Position of each of the model's channels 0..model_head_dim-1 inside a head of `head_dim` channels: the first
    ceil(d/2) at the start of the head, the other floor(d/2) at the start of its second half (identity when equal)."""
    if not 0 < model_head_dim <= head_dim or head_dim % 2 and head_dim != model_head_dim:
        raise ValueError(f"head_dim: cannot place {model_head_dim} channels in a padded head of {head_dim}")
    if model_head_dim == head_dim:
        return list(range(head_dim))
    first = (model_head_dim + 1) // 2
    return list(range(first)) + list(range(head_dim // 2, head_dim // 2 + model_head_dim - first))
