"""Many beam searches stepped together (server/generation/beam_batch.py) end every step in the state each search's own
`BeamSearch.step` leaves: the same hypotheses, scores (bit for bit), finished ones, order, copies and end, over
searches of different lengths, end tokens, length penalties, early stopping rules and budgets, side by side; and the
strategy steps a batch of searches together, falling back to the search's own step where a token is forced."""
from __future__ import annotations

import numpy as np

from server.generation.beam_batch import batchable, step_many
from server.generation.beams import BeamOptions, BeamSearch, BeamStrategy, numpy_top
from server.generation.scheduler import SeqState
from server.generation.strategies import StepContext, StepRow
from tests.scheduler_plans import BeamRequest

VOCAB = 60


def _search(options: BeamOptions, first_slot: int) -> BeamSearch:
    search = BeamSearch([BeamRequest()], options, VOCAB, tokenizer=None)
    for beam in search.beams:
        beam.state = SeqState(1, slot=first_slot + beam.index, owner=beam)
    return search


def _options(rng: np.random.Generator, k: int) -> BeamOptions:
    return BeamOptions(num_beams=k, length_penalty=float(rng.choice([1.0, 0.0, -0.5, 2.0, 1000.0])),
                       early_stopping=rng.choice([True, False, "never"]).item(),
                       max_new_tokens=int(rng.integers(1, 12)), eos_id=None if rng.random() < 0.2 else 2)


def _same(a: BeamSearch, b: BeamSearch) -> None:
    assert a.tokens == b.tokens and a.logprobs == b.logprobs and a.order == b.order
    assert a.scores.dtype == b.scores.dtype and a.scores.tobytes() == b.scores.tobytes()
    assert a.finished_scores.tobytes() == b.finished_scores.tobytes()
    assert a.finished_tokens == b.finished_tokens and a.finished_logprobs == b.finished_logprobs
    assert np.array_equal(a.finished_flags, b.finished_flags)
    assert (a.improvable, a.stopped, a.steps) == (b.improvable, b.stopped, b.steps)


def test_searches_stepped_together_end_each_step_as_each_alone() -> None:
    rng = np.random.default_rng(7)
    for trial in range(12):
        k = int(rng.choice([2, 3, 4]))
        options = [_options(rng, k) for _ in range(9)]
        alone = [_search(o, 4 * k * i) for i, o in enumerate(options)]
        together = [_search(o, 4 * k * i) for i, o in enumerate(options)]
        for step in range(12):
            live = [i for i, s in enumerate(alone) if not s.stopped]
            if not live:
                break
            # Integer-valued logits: ties between candidates everywhere (the lower index must win on both paths).
            rows = {i: {b: rng.integers(-3, 3, VOCAB).astype(np.float32) for b in range(k)} for i in live}
            scored = {i: {b: numpy_top(rows[i][b][None], 2 * k + 3) for b in range(k)} for i in live}
            scored = {i: {b: (v[0], t[0]) for b, (v, t) in s.items()} for i, s in scored.items()}
            want = [alone[i].step(rows[i], step + 1, numpy_top, scored[i]) for i in live]
            assert all(batchable(together[i], scored[i]) for i in live)
            got = step_many([together[i] for i in live], [step + 1] * len(live), [scored[i] for i in live])
            assert got == want, (trial, step)
            for i in live:
                _same(together[i], alone[i])
        assert all(s.stopped for s in alone), trial


def test_a_forced_step_is_not_batchable() -> None:
    search = _search(BeamOptions(num_beams=2, length_penalty=1.0, early_stopping=False, max_new_tokens=5, eos_id=2,
                                 forced={0: 3}), 0)
    scored = {0: (np.zeros(4, np.float32), np.arange(4))}
    assert not batchable(search, scored)
    search.steps = 1
    assert not batchable(search, scored)          # beam 1's row is missing after the first step
    assert batchable(search, {**scored, 1: scored[0]})


def test_the_strategy_steps_searches_together_and_a_forced_one_alone() -> None:
    rng = np.random.default_rng(3)
    plain = BeamOptions(num_beams=2, length_penalty=1.0, early_stopping=False, max_new_tokens=6, eos_id=2)
    forced = BeamOptions(num_beams=2, length_penalty=1.0, early_stopping=False, max_new_tokens=6, eos_id=2,
                         forced={1: 5})
    mine = [_search(o, 2 * i) for i, o in enumerate((plain, plain, forced))]
    theirs = [_search(o, 2 * i) for i, o in enumerate((plain, plain, forced))]
    for step in range(3):
        block = rng.standard_normal((6, VOCAB)).astype(np.float32) * 3
        rows = [StepRow(beam.state, block, 2 * i + beam.index, step + 1) for i, s in enumerate(mine)
                for beam in s.beams if s.steps or beam.index == 0]
        planned = BeamStrategy().plan(rows, StepContext(numpy_top))
        assert not planned.failed
        got = {id(states[0].owner.search): copies for states, copies in planned.copies}
        assert set(got) == {id(s) for s in mine}
        for i, search in enumerate(theirs):
            want = search.step({b: block[2 * i + b] for b in range(2)}, step + 1, numpy_top)
            assert got[id(mine[i])] == want
            _same(mine[i], search)
