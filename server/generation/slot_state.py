"""The running rows' per-iteration state as arrays indexed by slot, and the one rule that ends a row.

vLLM's persistent input batch is the model: what a step's outcome is checked against —
each slot's generated count, where its next token goes, its budgets, its stop-token set and its deadline — lives in
preallocated numpy arrays, written when the scheduler gives a sequence its slot (a few array writes), so a step's
tokens are applied and checked for every row at once instead of request by request. The worker thread's run of
several decode steps (executor.py) and the event loop (loop.py, outputs.py) read the same rule (`SlotState.ends`).

A chosen token ends its row when it is eos (unless the request ignores eos) or one of its stop ids, from the row's
min_tokens-th token on (as vLLM checks; the sampler masks them up to that one, logits_processors.MinTokens, so only a
forced token meets the difference); when it is the row's max_new_tokens-th; when its slot has no position left to write it (the context); and, for the worker's run,
when the row's deadline has passed. Stop strings are not here: they are matched on the text, which only the loop
has (detokenize.StopMatcher); a run that a stop string ends may compute a few tokens the loop then drops.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .params import GenerationParams
from .results import FINISH_CANCELLED, FINISH_EOS, FINISH_LENGTH, FINISH_STOP

if TYPE_CHECKING:
    from .scheduler import Plan

# What `ends` answers per row: 0 goes on; the others index REASONS.
GOES_ON, EOS, STOP, LENGTH, DEADLINE = range(5)
REASONS: tuple[str | None, ...] = (None, FINISH_EOS, FINISH_STOP, FINISH_LENGTH, FINISH_CANCELLED)

_NONE = -1     # an empty entry of the stop-id table (no token id is negative)


class Ending(Protocol):
    """What admission reads of a sequence's owner (a request's Sequence, or a beam)."""

    params: GenerationParams
    deadline: float | None


# The columns of SlotState's table (one row per slot, written at admission): a step gathers its rows' whole state in
# one indexing. The first three are as they were at admission; each advances by the tokens taken since (`taken`, one
# 1-D array: a step adds to it alone). _SPENT is minus the tokens the row may take (its budget and its slot's room,
# the nearer), so it rises with `taken`.
_GENERATED, _POSITION, _SPENT, _MIN_TOKENS, _EOS, _STOPS = range(6)
# Up to this many stop ids a step compares column by column; wider sets in one 2-D comparison.
_COLUMNWISE = 4


class SlotState:
    """One row per slot: what the stop rule reads, kept for the sequence that holds the slot.

    `ends` is called every step (on the loop, and by the worker's run at each of its steps) and almost always finds
    that no row ends: it answers that case with a handful of array operations, and spends more only on a step where
    some row ends."""

    def __init__(self, num_slots: int, eos_id: int | None, max_length: int) -> None:
        """max_length: the slots' context (no token is written at or past it)."""
        self.eos_id = _NONE if eos_id is None else eos_id
        self.max_length = max_length
        self.holder: list[Any] = [None] * num_slots      # the SeqState each row was written for
        # generated (tokens it held), position (where its first chosen token is written), spent, min_tokens, eos
        # (none with ignore_eos), then the stop ids (as many columns as the widest set admitted, _NONE-padded).
        self._table = np.full((num_slots, _STOPS), _NONE, np.int64)
        self.taken = np.zeros(num_slots, np.int64)       # tokens taken since admission
        self.deadline = np.full(num_slots, np.inf)

    @property
    def generated(self) -> np.ndarray:
        """Per slot, the tokens its sequence holds (a copy)."""
        return self._table[:, _GENERATED] + self.taken

    @property
    def position(self) -> np.ndarray:
        """Per slot, where its next chosen token is written (a copy)."""
        return self._table[:, _POSITION] + self.taken

    def admit(self, state: Any) -> None:
        """A sequence took its slot: its row, written once. `state` is a scheduler.SeqState whose owner has
        params, deadline and generated (what it already holds); its first chosen token goes at prompt_len."""
        slot, owner = state.slot, state.owner
        params: GenerationParams = owner.params
        stops = params.stop_token_ids
        if _STOPS + len(stops) > self._table.shape[1]:
            wider = np.full((len(self.holder), _STOPS + len(stops)), _NONE, np.int64)
            wider[:, :self._table.shape[1]] = self._table
            self._table = wider
        row = self._table[slot]
        generated, position = len(owner.generated), state.prompt_len
        # Its max_new_tokens-th token ends it, and so does one written at the slot's last position.
        room = min(params.max_new_tokens - generated, self.max_length - position + 1)
        row[:_STOPS] = (generated, position, -room, params.min_tokens, _NONE if params.ignore_eos else self.eos_id)
        row[_STOPS:] = _NONE
        row[_STOPS:_STOPS + len(stops)] = stops
        self.taken[slot] = 0
        self.holder[slot] = state
        self.deadline[slot] = np.inf if owner.deadline is None else owner.deadline

    def admit_plan(self, plan: "Plan") -> None:
        """The rows of the sequences a plan gave a slot: each reaches its slot through a prompt chunk (a gang's
        followers, a beam search's, through their first: its deadline is theirs); a row already written is kept."""
        for call in plan.prefill:
            for chunk in call.chunks:
                self.ensure(chunk.seq)
        for chunk in plan.tails:
            self.ensure(chunk.seq)

    def ensure(self, state: Any) -> None:
        """Admit `state` unless its slot's row is already its own."""
        if self.holder[state.slot] is not state:
            self.admit(state)

    def free(self, slot: int) -> None:
        self.holder[slot] = None
        self.deadline[slot] = np.inf

    def ends(self, slots: np.ndarray, tokens: np.ndarray, ahead: np.ndarray | int = 0,
             now: float | None = None) -> np.ndarray:
        """Per row, what `tokens[i]` does to the sequence in `slots[i]` (GOES_ON, EOS, STOP, LENGTH, DEADLINE), as
        its `ahead + 1`-th token past those taken (the worker's run checks tokens the loop has not taken yet).
        Deadlines are checked only with `now`: on the loop they end a row through its retirement instead."""
        rows = self._table.take(slots, axis=0)     # (take: a fraction of fancy indexing's cost)
        taken = self.taken.take(slots) + (ahead + 1)   # with this token
        eos = tokens == rows[:, _EOS]
        stop = self._stop(rows, tokens)
        length = rows[:, _SPENT] + taken >= 0
        late = self.deadline.take(slots) <= now if now is not None else None
        any_end = eos | length
        for other in (stop, late):
            if other is not None:
                any_end |= other
        out = np.zeros(len(slots), np.int8)
        if not np.count_nonzero(any_end):
            return out
        ender = rows[:, _GENERATED] + taken >= rows[:, _MIN_TOKENS]
        # Written from the weakest reason to the strongest: a row that several end reads the strongest.
        if late is not None:
            out[late] = DEADLINE
        out[length] = LENGTH
        if stop is not None:
            out[stop & ender] = STOP
        out[eos & ender] = EOS
        return out

    @staticmethod
    def _stop(rows: np.ndarray, tokens: np.ndarray) -> np.ndarray | None:
        """Per row, whether its token is one of its stop ids (None: no row admitted so far had any)."""
        width = rows.shape[1] - _STOPS
        if width == 0:
            return None
        if width > _COLUMNWISE:
            return (rows[:, _STOPS:] == tokens[:, None]).any(axis=1)
        stop = tokens == rows[:, _STOPS]
        for column in range(_STOPS + 1, rows.shape[1]):
            stop |= tokens == rows[:, column]
        return stop

    def take(self, slots: np.ndarray, tokens: np.ndarray, ahead: np.ndarray | int = 0) -> np.ndarray:
        """The rows take their tokens (a step's outcome, or a whole run's, applied on the loop): what `ends` says
        of each, then the rows advanced. With a run's steps a slot appears once a step, its `ahead` counting its
        tokens in the steps before."""
        out = self.ends(slots, tokens, ahead)
        if np.isscalar(ahead):
            self.taken[slots] += 1
        else:
            np.add.at(self.taken, slots, 1)     # a slot's several tokens of one run all count
        return out

def deadline_passed(seq: Ending, now: float) -> bool:
    """One sequence's deadline, on the loop (retiring rows between steps; the worker's run reads the array column
    through `ends`)."""
    return seq.deadline is not None and seq.deadline <= now
