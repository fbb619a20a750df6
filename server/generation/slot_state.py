"""The running rows' per-iteration state as arrays indexed by slot, and the one rule that ends a row.

vLLM's persistent input batch is the model: what a step's outcome is checked against — each slot's last token,
its generated count, where its next token goes, its budgets, its stop-token set and its deadline — lives in
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


class SlotState:
    """One row per slot: what the stop rule reads, kept for the sequence that holds the slot."""

    def __init__(self, num_slots: int, eos_id: int | None, max_length: int) -> None:
        """max_length: the slots' context (no token is written at or past it)."""
        self.eos_id = _NONE if eos_id is None else eos_id
        self.max_length = max_length
        self.holder: list[Any] = [None] * num_slots      # the SeqState each row was written for
        self.live = np.zeros(num_slots, bool)
        self.last = np.full(num_slots, _NONE, np.int64)  # the last token taken
        self.generated = np.zeros(num_slots, np.int64)   # tokens taken
        self.position = np.zeros(num_slots, np.int64)    # where the next chosen token is written
        self.max_new = np.zeros(num_slots, np.int64)
        self.min_tokens = np.zeros(num_slots, np.int64)
        self.eos = np.full(num_slots, _NONE, np.int64)   # the slot's eos id; none with ignore_eos
        self.stop_ids = np.full((num_slots, 0), _NONE, np.int64)   # grows to the widest set admitted
        self.deadline = np.full(num_slots, np.inf)

    def admit(self, state: Any) -> None:
        """A sequence took its slot: its row, written once. `state` is a scheduler.SeqState whose owner has
        params, deadline and generated (what it already holds); its first chosen token goes at prompt_len."""
        slot, owner = state.slot, state.owner
        params: GenerationParams = owner.params
        self.holder[slot] = state
        self.live[slot] = True
        self.last[slot] = _NONE
        self.generated[slot] = len(owner.generated)
        self.position[slot] = state.prompt_len
        self.max_new[slot] = params.max_new_tokens
        self.min_tokens[slot] = params.min_tokens
        self.eos[slot] = _NONE if params.ignore_eos else self.eos_id
        stops = params.stop_token_ids
        if len(stops) > self.stop_ids.shape[1]:
            wider = np.full((len(self.holder), len(stops)), _NONE, np.int64)
            wider[:, :self.stop_ids.shape[1]] = self.stop_ids
            self.stop_ids = wider
        self.stop_ids[slot] = _NONE
        self.stop_ids[slot, :len(stops)] = stops
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
        self.live[slot] = False
        self.deadline[slot] = np.inf

    def ends(self, slots: np.ndarray, tokens: np.ndarray, ahead: int = 0, now: float | None = None) -> np.ndarray:
        """Per row, what `tokens[i]` does to the sequence in `slots[i]` (GOES_ON, EOS, STOP, LENGTH, DEADLINE), as
        its `ahead + 1`-th token past those taken (the worker's run checks tokens the loop has not taken yet).
        Deadlines are checked only with `now`: on the loop they end a row through its retirement instead."""
        count = self.generated[slots] + (ahead + 1)
        ender = count >= self.min_tokens[slots]
        stop = (self.stop_ids[slots] == tokens[:, None]).any(axis=1) if self.stop_ids.shape[1] else False
        length = (count >= self.max_new[slots]) | (self.position[slots] + ahead >= self.max_length)
        out = np.where(ender & (tokens == self.eos[slots]), EOS,
                       np.where(ender & stop, STOP, np.where(length, LENGTH, GOES_ON)))
        if now is not None:
            out = np.where((out == GOES_ON) & (self.deadline[slots] <= now), DEADLINE, out)
        return out

    def take(self, slots: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """The rows take one token each (a step's outcome, applied on the loop): what `ends` says of it, then the
        rows advanced."""
        out = self.ends(slots, tokens)
        self.last[slots] = tokens
        self.generated[slots] += 1
        self.position[slots] += 1
        return out

    def expired(self, now: float) -> np.ndarray:
        """Per slot, whether its row's deadline has passed."""
        return self.live & (self.deadline <= now)


def deadline_passed(seq: Ending, now: float) -> bool:
    """For a sequence without a slot yet (a waiting one)."""
    return seq.deadline is not None and seq.deadline <= now
