"""Decoding strategies behind one interface: what the executor hands a step's logits to, and what comes back.

Every sequence the scheduler runs has an owner (a request's Sequence, or one beam of a BeamSearch) whose `strategy`
plans the next tokens of its rows from one step's logits. A strategy sees all of its rows of the step at once —
the sampling strategy every greedy and sampled row together (one argmax over the greedy rows:
sampling.choose_rows), the beam strategy every search's beams (beams.BeamStrategy) — and returns a `Planned`: the
token chosen for each row that gets one, the slot copies to make before the next step (a beam taking over another
beam's hypothesis), and the `Settle`s the event loop applies (a beam search's counts and answers). The executor
and the loop run every strategy the same way: neither asks which kind a row is.

Per-row logits processing (logit bias, min_tokens, the repetition / presence / frequency penalties) is a list of
`LogitsProcessor`s per sequence, applied to a row before its strategy chooses: logits_processors.py, where
grammar-constrained decoding's token masks plug in (made for all of a step's constrained rows at once:
sampling.choose_rows).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol

import numpy as np

from .sampling import Choice, choose_rows
from .scheduler import Copy, SeqState

if TYPE_CHECKING:
    from .scheduler import Scheduler

TopLogprobs = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class StepRow:
    """One row of a step for its strategy: `block[index]` is its logits ([>= vocab]; valid only in the worker
    thread, the runner may write the buffer again), `written` the positions its slot holds once this step's input
    is in (where its chosen token will be written)."""

    state: SeqState
    block: np.ndarray
    index: int
    written: int

    @property
    def logits(self) -> np.ndarray:
        return self.block[self.index]


class Settle(Protocol):
    """What a strategy leaves for the event loop after a step beyond the rows' choices."""

    @property
    def states(self) -> list[SeqState]:
        """The sequences it is about (they fail together when its slot copies fail)."""

    def settle(self, scheduler: "Scheduler", count_token: Callable[[object], None]) -> None:
        """Apply this step's result on the loop (scheduler changes, token counts, final answers)."""


@dataclass
class Planned:
    choices: list[tuple[SeqState, Choice]] = field(default_factory=list)   # rows that got a token, row order
    # Slot copies to make before the next step, with the sequences that fail if they fail (no target a source).
    copies: list[tuple[list[SeqState], list[Copy]]] = field(default_factory=list)
    settles: list[Settle] = field(default_factory=list)
    failed: list[tuple[list[SeqState], str, Exception]] = field(default_factory=list)


@dataclass
class StepContext:
    """What the executor lends strategies for a step: the top-log-probabilities graph (beam_scores.py)."""

    top: TopLogprobs


class Strategy(Protocol):
    """A family of rows that choose together."""

    runs_ahead: bool        # its rows may decode several steps in one worker call (executor.Run)

    def plan(self, rows: list[StepRow], context: StepContext) -> Planned:
        """The next tokens of `rows` (all of this strategy's rows of one step)."""


def stacked(rows: list[StepRow]) -> np.ndarray:
    """The rows' logits as one [rows, >= vocab] array: a slice of their block (no copy) when they are consecutive
    rows of one block, as the decode call's are."""
    block, first = rows[0].block, rows[0].index
    if all(r.block is block and r.index == first + i for i, r in enumerate(rows)):
        return block[first:first + len(rows)]
    if all(r.block is block for r in rows):
        return block[[r.index for r in rows]]
    return np.stack([r.logits for r in rows])


class SamplingStrategy:
    """Greedy and sampled rows (each with its own Sampler), chosen together."""

    runs_ahead = True

    def plan(self, rows: list[StepRow], context: StepContext) -> Planned:
        """The rows of each block chosen together (the decode call's rows: a view of its logits, no copy; each
        sampler is the row's own, so grouping changes no choice)."""
        blocks: dict[int, list[StepRow]] = {}
        for row in rows:
            blocks.setdefault(id(row.block), []).append(row)
        out = Planned()
        for group in blocks.values():
            samplers = [r.state.owner.sampler for r in group]
            out.choices += zip([r.state for r in group], choose_rows(samplers, stacked(group)))
        return out


SAMPLING = SamplingStrategy()


def plan_rows(rows: list[StepRow], context: StepContext) -> Planned:
    """Every row's strategy plans its rows (in the order strategies first appear); the plans merged."""
    groups: dict[int, tuple[Strategy, list[StepRow]]] = {}
    for row in rows:
        strategy: Strategy = row.state.owner.strategy
        groups.setdefault(id(strategy), (strategy, []))[1].append(row)
    out = Planned()
    for strategy, members in groups.values():
        planned = strategy.plan(members, context)
        out.choices += planned.choices
        out.copies += planned.copies
        out.settles += planned.settles
        out.failed += planned.failed
    return out
