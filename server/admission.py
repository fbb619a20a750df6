"""The cost model checked at admission: what a request will cost, bounded before anything of it runs.

Every task and every front door reaches the served models (server/encoders/encoder.py, server/generation/decoder_model.py), which call
these checks before tokenizing (rows) or before compute (candidates, estimated response size). A request that
can never fit, whatever the load, is refused with INVALID_ARGUMENT naming the field and the limit; requests
that could fit later (queue full, token budget in use) are refused elsewhere with RESOURCE_EXHAUSTED.

    limits = AdmissionLimits.from_settings(settings)
    check_rows("inputs", len(inputs), limits)
    check_candidates(masks, top_k, limits)
    check_response_bytes(estimate, limits, "top_k")
    check_request_memory("texts", tokens, ENCODED_TOKEN_BYTES + ENTITY_BYTES, limits)

Limits are settings (server/runtime/settings.py, docs/configuration.md) and tabled in docs/RELIABILITY.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from server.protocol.codecs import numpy_dtype
from server.protocol.errors import ServingError
from server.repository.signature import TensorSpec

# Bytes a message spends on one fill-mask candidate besides its texts (token_id, score, field tags, lengths).
CANDIDATE_OVERHEAD_BYTES = 32
# A candidate's token text is at most this many bytes (WordPiece words are cut at 100 characters; a BPE token
# is a few bytes): the estimate counts the worst case so it never understates.
MAX_TOKEN_BYTES = 400
DEFAULT_MAX_ROWS_PER_REQUEST = 1024
DEFAULT_MAX_PIECES_PER_REQUEST = 2
DEFAULT_MAX_FILL_MASK_CANDIDATES = 1024
DEFAULT_MAX_REQUEST_MEMORY_MB = 1024
# What one token of a request holds in the server while it runs, besides the graph's own buffers (bounded by the
# batch size, not the request): its tokenizer Encoding (id, type id, offsets, token text, masks) ...
ENCODED_TOKEN_BYTES = 160
# ... and, for token classification, its entity at worst (one per token): the Python objects (label, score, word,
# offsets) and the answer built from them (a protobuf message or a JSON object, then its bytes).
ENTITY_BYTES = 640


@dataclass(frozen=True)
class AdmissionLimits:
    """What one request may ask for (per request, whatever the load)."""

    max_rows_per_request: int = DEFAULT_MAX_ROWS_PER_REQUEST       # texts / tensor rows in one request
    max_pieces_per_request: int = DEFAULT_MAX_PIECES_PER_REQUEST   # pieces of one request in a batcher queue at once
    max_fill_mask_candidates: int = DEFAULT_MAX_FILL_MASK_CANDIDATES  # sum over texts of masks x top_k
    max_response_bytes: int = 64 * 1024 * 1024                     # = max_message_bytes
    max_request_memory_bytes: int = DEFAULT_MAX_REQUEST_MEMORY_MB << 20  # one request's estimated working memory

    def __post_init__(self) -> None:
        for name in ("max_rows_per_request", "max_pieces_per_request", "max_fill_mask_candidates",
                     "max_response_bytes", "max_request_memory_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"admission.{name}: must be an integer >= 1, got {value!r}")


def check_rows(field: str, rows: int, limits: AdmissionLimits) -> None:
    """INVALID_ARGUMENT when one request holds more rows than any request may (checked before tokenizing)."""
    if rows > limits.max_rows_per_request:
        raise ServingError.invalid(field, f"{rows} rows exceed max_rows_per_request {limits.max_rows_per_request} "
                                          "(send them in several requests)")


def check_candidates(masks: Sequence[int], top_k: int, limits: AdmissionLimits) -> int:
    """Fill-mask answers masks x top_k candidates, each with its filled sequence: the count is bounded.
    Returns the candidate count."""
    total_masks = sum(masks)
    candidates = total_masks * top_k
    if candidates > limits.max_fill_mask_candidates:
        raise ServingError.invalid("top_k", f"{total_masks} masks x top_k {top_k} = {candidates} candidates exceed "
                                            f"max_fill_mask_candidates {limits.max_fill_mask_candidates} "
                                            "(fewer masks per request or a lower top_k)")
    return candidates


def fill_mask_bytes(masks: Sequence[int], top_k: int, sequence_bytes: Sequence[int]) -> int:
    """Estimated answer size: every candidate of text i carries text i's filled sequence and its token."""
    return sum(m * top_k * (n + MAX_TOKEN_BYTES + CANDIDATE_OVERHEAD_BYTES) for m, n in zip(masks, sequence_bytes))


def tensor_bytes(outputs: Sequence[TensorSpec], sizes: Mapping[str, int], default: int) -> int:
    """Estimated size of raw outputs: each symbolic axis ("batch", "sequence", "vocab", ...) takes its size from
    `sizes`, an unknown one `default` (the sequence width: never smaller than what the graph can return for
    an axis it grows)."""
    total = 0
    for spec in outputs:
        elements = 1
        for dim in spec.dims:
            if isinstance(dim, int):
                elements *= max(dim, 1)
            else:
                elements *= sum(sizes.get(symbol, default) for symbol in dim) if dim else default
        total += elements * _itemsize(spec.datatype)
    return total


def _itemsize(datatype: str) -> int:
    if datatype == "BYTES":
        return 16
    try:
        return int(np.dtype(numpy_dtype(datatype)).itemsize)
    except (KeyError, TypeError, ValueError):  # an unknown name: count the widest numeric type
        return 8


def check_response_bytes(estimate: int, limits: AdmissionLimits, field: str) -> None:
    """INVALID_ARGUMENT when the answer would exceed the largest message the server may send."""
    if estimate > limits.max_response_bytes:
        raise ServingError.invalid(field, f"the answer would take about {estimate} bytes, more than "
                                          f"max_message_bytes {limits.max_response_bytes}")


def check_request_memory(field: str, tokens: int, bytes_per_token: int, limits: AdmissionLimits) -> None:
    """INVALID_ARGUMENT when a request's tokens would hold more memory while it runs than one request may
    (checked after tokenizing, before compute: what its tokens cost, as the token bound itself is checked)."""
    estimate = tokens * bytes_per_token
    if estimate > limits.max_request_memory_bytes:
        raise ServingError.invalid(field, f"{tokens} tokens would hold about {estimate >> 20} MiB in the server while "
                                          f"the request runs, more than max_request_memory_mb "
                                          f"{limits.max_request_memory_bytes >> 20} (send fewer or shorter texts per "
                                          "request)")


__all__ = ["AdmissionLimits", "ENCODED_TOKEN_BYTES", "ENTITY_BYTES", "check_candidates", "check_request_memory",
           "check_response_bytes", "check_rows", "fill_mask_bytes", "tensor_bytes"]
