"""Output processing: a step's chosen tokens become their requests' next chunks.

`take_tokens` applies one step's tokens to their rows' array state all at once (slot_state.py: the stop tokens and
the budgets, checked for every row in a few array operations); then, per row, the token becomes its text (never a
partial character, never a stop sequence or the part of one that may still complete) with the tokens whose text it
releases (sequence.py: the token list beside the text), the end of the sequence when the rule or the text says so,
and the chunk on the request's queue. Runs on the event loop, after the step."""
from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
from tokenizers import Tokenizer

from .results import FINISH_LENGTH, FINISH_STOP, StreamChunk
from .sampling import Choice
from .scheduler import SeqState
from .sequence import Sequence, to_generated_token
from .slot_state import REASONS, SlotState


def take_tokens(rows: Iterable[tuple[SeqState, Choice | None]], slots: SlotState, tokenizer: Tokenizer,
                count: Callable[[Sequence], None]) -> None:
    """One step's tokens for their rows (a row whose request is done, cancelled, or got no token is passed over):
    the array state advanced and checked at once, then each row's text and chunk. count: the engine's per-token
    metric."""
    taken = [(state, choice) for state, choice in rows
             if choice is not None and not (state.owner.cancelled or state.owner.done)]
    if not taken:
        return
    n = len(taken)
    ends = slots.take(np.fromiter((s.slot for s, _ in taken), np.intp, n),
                      np.fromiter((c.token_id for _, c in taken), np.int64, n))
    for (state, choice), end in zip(taken, ends.tolist()):
        count(state.owner)
        emit_token(state.owner, choice, tokenizer, REASONS[end])


def emit_token(seq: Sequence, choice: Choice, tokenizer: Tokenizer, reason: str | None) -> None:
    """Append the (already sampled and observed) token to the sequence and send what it produced. reason: what
    the stop rule said of the token (slot_state.SlotState.ends), None: it goes on."""
    token = choice.token_id
    seq.generated.append(token)
    generated = to_generated_token(choice, tokenizer)
    if seq.quiet:
        # Its consumer reads only the end: the text of its tokens is made there, all at once (Sequence.catch_up).
        if reason is None or reason == FINISH_LENGTH:
            seq.deferred.append(generated)
            if reason is not None:
                seq.finish(reason)
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
        released = seq.take_released()
        if text or released:     # (nothing when a stop string may still take this token's text)
            seq.send(StreamChunk(text=text, tokens=released, prompt_tokens=seq.take_prompt_tokens()))
