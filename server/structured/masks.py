"""Each constrained sequence's grammar state in the sampler (`RowMatcher`, a TokenConstraint), and the token masks of
a step's constrained rows made together (`StepMasks`, one per model).

A step's masks are made in one go, in the engine's worker thread, between the graph's steps (sampling.choose_rows
asks `StepMasks.allowed` for all of its constrained rows): each row's llguidance bitmask is filled into one shared
array, then one unpack turns the whole array into booleans [rows, vocab]. The greedy rows with no other processor
then take one masked argmax together (sampling.py); any other row's `apply` reads its own line of that array. A row
whose `apply` runs with no mask made for it (outside choose_rows) makes its own.

The end-of-text token is allowed exactly when the grammar accepts what was generated (llguidance puts it in the mask
then). A matcher in an error state (a limit of the library hit mid-answer) allows the end-of-text token alone: the
answer ends there.

Not overlapped with the graph, though the next step's masks depend only on tokens already chosen. Filled in a
thread of their own while the graph runs (the variant tried: bench/FINDINGS.md), they measured no faster on the
2-core machine this is tuned for: the graph's two intra-op threads spin on both cores, so the mask thread takes a
core from the graph or waits for one (and the step then waits for it), and once batched the fill is a small part of
a step. Serial, nothing else touches a matcher, and no thread waits on another.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np

from .row import TokenConstraint

log = logging.getLogger(__name__)


class RowMatcher:
    """One sequence's grammar state (a TokenConstraint): its llguidance matcher, and the allowed tokens of its next
    choice once its model's StepMasks has made them."""

    def __init__(self, matcher: Any, masks: "StepMasks") -> None:
        self.matcher, self._masks = matcher, masks
        self.next: np.ndarray | None = None        # [vocab] bool: this step's allowed tokens, once made

    @property
    def masks(self) -> "StepMasks":
        return self._masks

    @property
    def accepting(self) -> bool:
        return bool(self.matcher.is_accepting())

    def apply(self, scores: np.ndarray) -> None:
        if self.next is None:
            self._masks.allowed([self])
        assert self.next is not None
        scores[~self.next] = -np.inf

    def advance(self, token: int) -> None:
        self.next = None
        if not self.matcher.is_stopped() and not self.matcher.consume_token(token):
            log.warning("constrained generation: token %d refused: %s", token, self.matcher.get_error())


class StepMasks:
    """The masks of one model's constrained rows (its logits' width, its end-of-text id), made a step at a time."""

    def __init__(self, vocab_size: int, eos_id: int | None) -> None:
        self.vocab_size, self.eos_id = vocab_size, eos_id
        self._words = (vocab_size + 31) // 32

    def allowed(self, rows: Sequence[TokenConstraint]) -> np.ndarray:
        """Each row's allowed next tokens, [rows, vocab] bool (row i's `apply` then reads line i)."""
        own = [_own(r) for r in rows]
        bits = self._fill([r.matcher for r in own])
        # Bit j of the little-endian words is token j.
        allowed = np.unpackbits(bits.view(np.uint8), axis=1, count=self.vocab_size, bitorder="little").view(bool)
        for i, row in enumerate(own):
            if row.matcher.is_error():
                log.warning("constrained generation stopped: %s", row.matcher.get_error())
                allowed[i] = False
                if self.eos_id is not None:     # always, in practice: no grammar compiles without one
                    allowed[i, self.eos_id] = True
            row.next = allowed[i]
        return allowed

    def _fill(self, matchers: list[Any]) -> np.ndarray:
        """The matchers' bitmasks [len, words] (llguidance computes them with the GIL released)."""
        bits = np.empty((len(matchers), self._words), dtype=np.int32)
        # Straight into each line of one C-contiguous array whose lines are exactly a mask long (what
        # llguidance.numpy.fill_next_token_bitmask checks before the same call, at several times the call's cost on
        # a string's mask). llguidance's own batched fill (fill_next_token_bitmask_par) hands the rows to a pool of
        # its threads and waits: slower than this loop for a step's few rows (bench/FINDINGS.md).
        base, line = bits.ctypes.data, bits.strides[0]
        for i, matcher in enumerate(matchers):
            matcher.unsafe_compute_mask_ptr(base + i * line, line)
        return bits


def _own(row: TokenConstraint) -> RowMatcher:
    if not isinstance(row, RowMatcher):
        raise TypeError(f"StepMasks masks RowMatchers, not {type(row).__name__}")
    return row
