"""When a sequence ends: the one rule the worker's multi-step run (executor.py) and the event loop (outputs.py,
loop.py) both read. Stop strings are not here: they are matched on the text, which only the loop has
(detokenize.StopMatcher); a run that a stop string ends may compute a few tokens the loop then drops.

A chosen token ends its sequence when it is eos (unless the request ignores eos), one of its stop ids, its
max_new_tokens-th, or when its slot has no position left to write it (the context); a sequence also ends when its
deadline passes (finish_reason "cancelled", keeping what it produced).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .params import GenerationParams
from .results import FINISH_EOS, FINISH_LENGTH, FINISH_STOP


class Ending(Protocol):
    """What the rule reads of a request."""

    params: GenerationParams
    deadline: float | None


@dataclass(frozen=True)
class StopRules:
    eos_id: int | None
    max_length: int          # the slots' context

    def reason(self, seq: Ending, token: int, generated: int, position: int) -> str | None:
        """The finish reason `token` gives its sequence, or None: it goes on. generated: the sequence's tokens
        with this one; position: where this token would be written in its slot."""
        params = seq.params
        if token == self.eos_id and not params.ignore_eos:
            return FINISH_EOS
        if token in params.stop_token_ids:
            return FINISH_STOP
        if generated >= params.max_new_tokens or position >= self.max_length:
            return FINISH_LENGTH
        return None


def deadline_passed(seq: Ending, now: float) -> bool:
    return seq.deadline is not None and seq.deadline <= now
