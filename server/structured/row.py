"""The seam between the sampler and a constraint: what one row's choice asks of it (the shape of the engine's
LogitsProcessor, server/generation/logits_processors.py: the sampler runs it as the row's first processor)."""
from __future__ import annotations

from typing import Protocol

import numpy as np


class TokenConstraint(Protocol):
    """A row's grammar state. `apply` sets every token the grammar does not allow next to -inf in that row's
    scores (its own float copy, shape [vocab]) before the choice; `advance` moves the state past the chosen token."""

    def apply(self, scores: np.ndarray) -> None: ...

    def advance(self, token: int) -> None: ...
