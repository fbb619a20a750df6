"""Beam searches stepped together (beams.BeamStrategy over one step's rows, beam_select.py's arrays) keep exactly
what each keeps stepped alone (BeamSearch.step), whatever else shares the step: other widths, lengths, eos,
length penalties, early_stopping modes, forced tokens, first steps reading beam 0 alone, rows out of order in the
logits block. And the candidates rank as a plain sort does: by score, ties to the lower hypothesis, then token."""
from __future__ import annotations

import numpy as np

from server.generation import beam_select
from server.generation.beams import BEAMS, BeamOptions, BeamSearch, numpy_top
from server.generation.scheduler import SeqState
from server.generation.strategies import StepContext, StepRow
from tests.scheduler_plans import BeamRequest

VOCAB = 40
PAD = 3      # the logits block is wider than the vocabulary, as a graph's padded head is
OPTIONS = [  # (num_beams, length_penalty, early_stopping, max_new_tokens, eos_id, forced, first step reads beam 0 only)
    (4, 1.0, False, 12, 2, {}, True),
    (4, 0.5, True, 12, 2, {}, False),
    (4, 2.0, "never", 9, 3, {}, True),
    (4, 1.0, False, 7, None, {}, False),
    (4, 1.0, False, 10, 2, {0: 5, 9: 2}, False),
    (2, 1.0, False, 10, 2, {}, True),
    (3, -0.5, True, 8, 4, {}, False),
    (4, 1.0, True, 12, 2, {}, True),
]


def _search(options: tuple, slots: list[int]) -> BeamSearch:
    k, penalty, early, max_new, eos, forced, _ = options
    search = BeamSearch([BeamRequest()], BeamOptions(num_beams=k, length_penalty=penalty, early_stopping=early,
                                                  max_new_tokens=max_new, eos_id=eos, forced=forced), VOCAB,
                        tokenizer=None)
    for beam, slot in zip(search.beams, slots):
        beam.state = SeqState(1, owner=beam, slot=slot)
    return search


def _same(a: BeamSearch, b: BeamSearch) -> None:
    assert a.steps == b.steps and a.stopped == b.stopped and a.improvable == b.improvable
    assert a.tokens == b.tokens and a.logprobs == b.logprobs and np.array_equal(a.order, b.order)
    assert np.array_equal(a.scores, b.scores)
    assert np.array_equal(a.finished_scores, b.finished_scores)
    assert np.array_equal(a.finished_flags, b.finished_flags)
    assert a.finished_tokens == b.finished_tokens and a.finished_logprobs == b.finished_logprobs


def test_searches_stepped_together_keep_what_each_keeps_alone() -> None:
    rng = np.random.default_rng(3)
    stopped = copied = finished = 0
    for trial in range(12):
        slot = iter(range(1000))
        pairs = [(_search(o, s := [next(slot) for _ in range(o[0])]), _search(o, s), o[6]) for o in OPTIONS]
        start = rng.integers(0, 4, len(pairs))               # searches join the steps at different iterations
        for iteration in range(16):
            live = [(a, b, only_first) for (a, b, only_first), s in zip(pairs, start)
                    if s <= iteration and not a.stopped]
            if not live:
                break
            wanted = [(a, b, beam) for a, b, only_first in live for beam in range(a.options.num_beams)
                      if not (only_first and a.steps == 0 and beam)]
            order = rng.permutation(len(wanted))             # rows of the block in no particular order
            if trial % 2:
                block = (rng.integers(-3, 3, (len(wanted), VOCAB + PAD)) * 0.5).astype(np.float32)   # ties
            else:
                block = (rng.standard_normal((len(wanted), VOCAB + PAD)) * 3).astype(np.float32)
            rows, alone = [], {}
            for i, (a, b, beam) in zip(order, wanted):
                rows.append(StepRow(b.beams[beam].state, block, int(i), b.steps + 1))
                alone.setdefault(id(a), (a, {}))[1][beam] = block[i]
            planned = BEAMS.plan(rows, StepContext(numpy_top))
            assert not planned.failed
            together = {id(states[0].owner.search): copies for states, copies in planned.copies}
            # The copies of one width's searches go at one length, the longest any needs (one gather per buffer).
            lengths: dict[int, set[int]] = {}
            for states, copies in planned.copies:
                lengths.setdefault(len(states), set()).update(c.length for c in copies)
            assert all(len(n) == 1 for n in lengths.values())
            for a, b, _ in live:
                copies = a.step(alone[id(a)][1], a.steps + 1, numpy_top)
                mine = together.get(id(b.beams[0].search), [])
                assert [(c.source, c.target) for c in mine] == [(c.source, c.target) for c in copies]
                assert all(c.length == a.steps for c in copies) and all(a.steps <= c.length for c in mine)
                _same(a, b)
                copied += len(copies)
        for a, b, _ in pairs:
            stopped += a.stopped
            finished += int(a.finished_flags.sum())
    assert stopped > 50 and copied > 100 and finished > 100, (stopped, copied, finished)


def test_candidates_rank_by_score_then_hypothesis_then_token() -> None:
    """The 2k candidates of each search, as a sorted() of all k x 2k by (-score, hypothesis, token) gives them."""
    rng = np.random.default_rng(4)
    s, k, vocab = 32, 4, 30
    for trial in range(20):
        tokens = np.stack([np.stack([rng.permutation(vocab)[:2 * k] for _ in range(k)]) for _ in range(s)])
        values = (-rng.integers(0, 4, (s, k, 2 * k)) * 0.25).astype(np.float32)
        scores = (-rng.integers(0, 3, (s, k)) * 0.25).astype(np.float32)
        before = beam_select.Before(values, tokens, scores, np.full((s, k), beam_select.NEG, np.float32),
                                    np.zeros((s, k), bool), np.ones(s, bool), np.full(s, 1), np.full(s, -1),
                                    np.full(s, 10), np.ones(s), np.zeros(s, bool), np.zeros(s, bool))
        after = beam_select.step(before, vocab)
        for i in range(s):
            everything = [(-(values[i, h, c] + scores[i, h]), h, tokens[i, h, c]) for h in range(k)
                          for c in range(2 * k)]
            want = sorted(everything)[:2 * k]
            got = list(zip(after.candidate_parent[i].tolist(), after.candidate_token[i].tolist()))
            assert got == [(h, t) for _, h, t in want]


def test_a_search_missing_a_beam_fails_alone_and_the_others_step() -> None:
    rng = np.random.default_rng(5)
    whole, short = _search(OPTIONS[0], [0, 1, 2, 3]), _search(OPTIONS[0], [4, 5, 6, 7])
    for step in range(2):
        block = rng.standard_normal((8, VOCAB + PAD)).astype(np.float32)
        searches = (whole, short) if step == 0 else (whole,)
        rows = [StepRow(s.beams[b].state, block, 4 * n + b, step + 1) for n, s in enumerate(searches) for b in range(4)]
        if step == 1:
            rows.append(StepRow(short.beams[0].state, block, 4, 2))         # one of its four beams
        planned = BEAMS.plan(rows, StepContext(numpy_top))
    assert [(states, what, str(exc)) for states, what, exc in planned.failed] == [
        (short.states, "beam search step failed", "beam search: 1 of its 4 beams stepped")]
    assert whole.steps == 2 and short.steps == 1 and planned.settles == [whole]
