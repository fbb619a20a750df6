"""Output processing: a step's chosen tokens become their requests' next chunks.

`take_steps` applies a run's tokens (one step's: `take_tokens`) to their rows' array state all at once
(slot_state.py: the stop tokens and the budgets, checked for every row and step in a few array operations); then, per row, the token becomes its text (never a
partial character, never a stop sequence or the part of one that may still complete) with the tokens whose text it
releases (sequence.py: the token list beside the text), the end of the sequence when the rule or the text says so,
and the chunk on the request's queue. Runs on the event loop, after the step."""
from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
from tokenizers import Tokenizer

from .results import FINISH_LENGTH, FINISH_STOP
from .sampling import Choice
from .scheduler import SeqState
from .sequence import Sequence, to_generated_token
from .slot_state import REASONS, SlotState


def take_tokens(rows: Iterable[tuple[SeqState, Choice | None]], slots: SlotState, tokenizer: Tokenizer,
                count: Callable[[Sequence], None]) -> None:
    """One step's tokens for their rows (take_steps with one step). count: the engine's per-token metric."""
    take_steps([rows], slots, tokenizer, count)


def take_steps(steps: Iterable[Iterable[tuple[SeqState, Choice | None]]], slots: SlotState, tokenizer: Tokenizer,
               count: Callable[[Sequence], None],
               before_step: Callable[[list[tuple[SeqState, Choice | None]]], None] | None = None) -> None:
    """A run's steps, in order, for their rows: the array state advanced and checked for every (step, row) at once
    (a row's k-th token of the run judged k - 1 tokens past those its slot had taken, as the worker judged it), then
    step by step each row's text and chunk. A row whose request is done, cancelled, or got no token is passed over;
    one that a stop string ends at a step loses its later tokens. before_step: called with each later step's live
    rows before their tokens are applied (the scheduler's record of the token each step's call consumed)."""
    steps = [list(step) for step in steps]
    at: dict[tuple[int, int], int] = {}       # (step, slot) -> the pair's index in the arrays
    seen: dict[int, int] = {}
    slot_ids: list[int] = []
    token_ids: list[int] = []
    ahead: list[int] = []
    for i, step in enumerate(steps):
        for state, choice in step:
            if choice is None or state.owner.cancelled or state.owner.done:
                continue
            k = seen.get(state.slot, 0)
            seen[state.slot] = k + 1
            at[i, state.slot] = len(slot_ids)
            slot_ids.append(state.slot)
            token_ids.append(choice.token_id)
            ahead.append(k)
    ends = slots.take(np.array(slot_ids, np.intp), np.array(token_ids, np.int64),
                      0 if len(steps) == 1 else np.array(ahead, np.int64)).tolist() if slot_ids else []
    for i, step in enumerate(steps):
        if i:
            step = [(state, choice) for state, choice in step if not (state.owner.done or state.owner.cancelled)]
            if before_step is not None:
                before_step(step)
        for state, choice in step:
            pair = at.get((i, state.slot))
            if pair is None or state.owner.cancelled or state.owner.done:
                continue
            count(state.owner)
            emit_token(state.owner, choice, tokenizer, REASONS[ends[pair]])


def emit_token(seq: Sequence, choice: Choice, tokenizer: Tokenizer, reason: str | None) -> None:
    """Append the (already sampled and observed) token to the sequence and send what it produced. reason: what
    the stop rule said of the token (slot_state.SlotState.ends), None: it goes on."""
    token = choice.token_id
    seq.generated.append(token)
    generated = to_generated_token(choice, tokenizer)
    if seq.quiet:
        # Its consumer reads its text only with later tokens': the text is made when they go out, all at once
        # (Sequence.catch_up): at the end, or when an interval is full.
        if reason is None or reason == FINISH_LENGTH:
            seq.deferred.append(generated)
            if reason is not None:
                seq.finish(reason)
            elif seq.interval_full():
                seq.send_released(seq.catch_up())
        else:
            seq.finish(reason, tokens=[generated])
        return
    # eos and stop-token ids end the sequence; their text is not part of the output.
    if reason is not None and reason != FINISH_LENGTH:
        seq.finish(reason, tokens=[generated])
        return
    text = seq.add_text(generated, seq.detokenizer.push(token))
    if seq.stopper.stopped:
        seq.finish(FINISH_STOP, text)
    elif reason is not None:
        seq.finish(reason, text)
    else:
        seq.send_released(text)
