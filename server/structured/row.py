"""The seam between the sampler and a constraint: what one row's choice asks of it (the shape of the engine's
LogitsProcessor, server/generation/logits_processors.py: the sampler runs it as the row's first processor), and what
masks a step's constrained rows together (sampling.choose_rows asks it for all of them at once)."""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np


class ConstraintMasks(Protocol):
    """One model's constrained rows, masked a step at a time."""

    def allowed(self, rows: Sequence["TokenConstraint"]) -> np.ndarray:
        """Each row's allowed next tokens, [rows, vocab] bool, made together; each row's `apply` then reads its
        own line."""
        ...


class TokenConstraint(Protocol):
    """A row's grammar state. `apply` sets every token the grammar does not allow next to -inf in that row's
    scores (its own float copy, shape [vocab]) before the choice; `advance` moves the state past the chosen token;
    `masks` is its model's ConstraintMasks."""

    @property
    def masks(self) -> ConstraintMasks: ...

    def apply(self, scores: np.ndarray) -> None: ...

    def advance(self, token: int) -> None: ...
