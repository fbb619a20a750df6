"""Per-row logits processing: each sequence's list of processors, applied in order to its row's own working copy
of the logits before its strategy chooses (`apply_processors`, the one place they run), each told the chosen token
afterwards (`advance`). The sampler builds the list from the request's parameters (sampling.Sampler), in this order:
logit bias -> min_tokens (eos and stop ids masked) -> repetition penalty -> presence / frequency penalties.

Grammar-constrained decoding plugs in here: server/structured's RowMatcher is a processor whose `apply` sets -inf
outside the tokens the grammar allows (llguidance's token mask) and whose `advance` moves its matcher; admission
compiles it and the sampler puts it first in the sequence's list. The masks of a step's constrained rows are made
together before any of them chooses (sampling.choose_rows; server/structured/masks.py), and a greedy row whose only
processor is its grammar takes one masked argmax with the others like it, without `apply`.
Beam rows have no list today (beam search refuses every field that would make a processor); a grammar on beams
would apply its mask to each beam's row in beams.BeamStrategy.plan, before the rows are scored.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np


class LogitsProcessor(Protocol):
    """One sequence's edit of its row of logits before the choice."""

    def apply(self, row: np.ndarray) -> None:
        """Edit `row` ([vocab] float64, the strategy's own copy) in place."""

    def advance(self, token: int) -> None:
        """The token chosen after this row (for the state the next `apply` reads)."""


def apply_processors(processors: list[LogitsProcessor], row: np.ndarray) -> None:
    """A row's processors, in order, in place: the one place per-row logits processing runs."""
    for processor in processors:
        processor.apply(row)


class LogitBias:
    """OpenAI's logit_bias: added to the model's logits (ids within the vocabulary: the engine refuses others)."""

    def __init__(self, bias: list[tuple[int, float]]) -> None:
        self.ids = np.array([t for t, _ in bias], dtype=np.int64)
        self.values = np.array([b for _, b in bias], dtype=np.float64)

    def apply(self, row: np.ndarray) -> None:
        row[self.ids] += self.values

    def advance(self, token: int) -> None:
        pass


class MinTokens:
    """The tokens that would end the sequence (eos, stop ids) masked until `minimum` tokens are generated."""

    def __init__(self, enders: np.ndarray, minimum: int) -> None:
        self.enders, self.minimum, self.generated = enders, minimum, 0

    @property
    def masked(self) -> np.ndarray | None:
        return self.enders if self.generated < self.minimum else None

    def apply(self, row: np.ndarray) -> None:
        if self.generated < self.minimum:
            row[self.enders] = -np.inf

    def advance(self, token: int) -> None:
        self.generated += 1


class RepetitionPenalty:
    """CTRL's penalty on every token present so far, the prompt's included (as CTRL and HF count them)."""

    def __init__(self, penalty: float, vocab_size: int, prompt_ids: list[int]) -> None:
        self.penalty = penalty
        self.seen = np.zeros(vocab_size, dtype=bool)
        ids = np.asarray(prompt_ids, dtype=np.int64)
        self.seen[ids[(ids >= 0) & (ids < vocab_size)]] = True

    def apply(self, row: np.ndarray) -> None:
        row[:] = apply_repetition_penalty(row, self.seen, self.penalty)

    def advance(self, token: int) -> None:
        if 0 <= token < self.seen.shape[0]:
            self.seen[token] = True


class PresenceFrequency:
    """OpenAI's presence and frequency penalties over the generated tokens:
    logit -= presence * [count > 0] + frequency * count."""

    def __init__(self, presence: float, frequency: float, vocab_size: int) -> None:
        self.presence, self.frequency = presence, frequency
        self.counts = np.zeros(vocab_size, dtype=np.float64)

    def apply(self, row: np.ndarray) -> None:
        row -= self.presence * (self.counts > 0) + self.frequency * self.counts

    def advance(self, token: int) -> None:
        if 0 <= token < self.counts.shape[0]:
            self.counts[token] += 1


def apply_repetition_penalty(scores: np.ndarray, seen: np.ndarray, penalty: float) -> np.ndarray:
    """CTRL penalty: for tokens already present, divide positive logits and multiply negative ones."""
    out = scores.copy()
    s = out[seen]
    out[seen] = np.where(s > 0, s / penalty, s * penalty)
    return out
