"""Shared by the scheduler and beam tests: what the engine does with a plan's results, and a request of four beams
as a beam search sees it."""
from __future__ import annotations

from server.generation.params import GenerationParams
from server.generation.scheduler import Plan, Scheduler


def execute(s: Scheduler, plan: Plan) -> None:
    """What the engine does with a plan's results (every call succeeded)."""
    for seq in plan.decode:
        s.decoded(seq)
    for call in plan.prefill:
        for chunk in call.chunks:
            s.prefilled(chunk)
    for chunk in plan.tails:
        s.prefilled(chunk)


class BeamRequest:
    """A request of four beams, as a search sees it."""
    prompt_ids = [0]
    params = GenerationParams.validate(num_beams=4)
    cancelled = done = False
