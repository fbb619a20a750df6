"""The decoding seams in process: a logits processor on a sequence's list (where a grammar's token mask plugs in),
rows planned by their strategies (the stop rule: test_slot_state.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from server.generation.params import GenerationParams
from server.generation.sampling import Choice, Sampler, choose_rows
from server.generation.scheduler import SeqState
from server.generation.strategies import Planned, StepContext, StepRow, plan_rows

VOCAB = 16


class AllowOnly:
    """A grammar-like mask: every token but `allowed` at -inf; remembers what it was told."""

    def __init__(self, allowed: list[int]) -> None:
        self.allowed, self.told = np.array(allowed), []

    def apply(self, row: np.ndarray) -> None:
        keep = row[self.allowed].copy()
        row[:] = -np.inf
        row[self.allowed] = keep

    def advance(self, token: int) -> None:
        self.told.append(token)


def test_a_processor_on_the_list_masks_the_choice_of_greedy_and_sampled_rows_and_hears_the_token() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, VOCAB)).astype(np.float32)
    allowed = [3, 9, 12]
    greedy = Sampler(GenerationParams.validate(max_new_tokens=4), VOCAB, [1, 2])
    sampled = Sampler(GenerationParams.validate(max_new_tokens=4, temperature=1.0, seed=5), VOCAB, [1, 2])
    masks = [AllowOnly(allowed), AllowOnly(allowed)]
    for sampler, mask in zip((greedy, sampled), masks):
        assert sampler.batch_greedy or sampler is sampled
        sampler.processors.append(mask)
    assert not greedy.batch_greedy          # a processor beyond min_tokens: chosen alone, masked
    choices = choose_rows([greedy, sampled], logits)
    assert choices[0].token_id == allowed[int(np.argmax(logits[0, allowed]))]
    assert choices[1].token_id in allowed
    assert [m.told for m in masks] == [[choices[0].token_id], [choices[1].token_id]]


@dataclass
class Owner:
    strategy: object
    sampler: Sampler | None = None


@dataclass
class Recording:
    """A strategy that records the rows it was given and chooses token 7 for each."""

    runs_ahead: bool = True
    calls: list[list[int]] = field(default_factory=list)

    def plan(self, rows: list[StepRow], context: StepContext) -> Planned:
        self.calls.append([r.index for r in rows])
        return Planned(choices=[(r.state, Choice(7, None, ())) for r in rows])


def test_each_strategy_plans_all_its_rows_of_a_step_at_once() -> None:
    a, b = Recording(), Recording()
    states = [SeqState(1, owner=Owner(s)) for s in (a, b, a, b, a)]
    block = np.zeros((5, VOCAB), np.float32)
    planned = plan_rows([StepRow(s, block, i, 1) for i, s in enumerate(states)], StepContext(lambda x, n: (x, x)))
    assert (a.calls, b.calls) == ([[0, 2, 4]], [[1, 3]])
    assert sorted(id(s) for s, _ in planned.choices) == sorted(id(s) for s in states)
