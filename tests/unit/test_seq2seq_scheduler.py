"""The slot scheduler's encoder-decoder plans (sources encoded at admission, start tokens riding the decode call) and
beam gangs, and a beam search's slot reordering: plans and numpy only, no onnxruntime, no model."""
from __future__ import annotations

import numpy as np

from server.generation.beams import BeamOptions, BeamSearch
from server.generation.scheduler import Scheduler, SchedulerConfig, SeqState, Status
from tests.scheduler_plans import BeamRequest, execute


def make(slots: int = 4, chunk: int = 8, max_prefill: int = 64, reuse: bool = False) -> Scheduler:
    return Scheduler(SchedulerConfig(num_slots=slots, chunk_tokens=chunk, max_prefill_tokens=max_prefill,
                                     prefix_reuse=reuse, min_reuse_tokens=1))


def source(n: int, gang: int = 1) -> SeqState:
    """A seq2seq sequence: its decoder prompt is the start token, its source n tokens."""
    return SeqState(1, source=n, gang=gang)




def test_sources_admitted_together_are_encoded_in_one_call_and_their_start_tokens_ride_the_decode_call() -> None:
    s = make()
    seqs = [source(n) for n in (5, 11, 3)]
    for q in seqs:
        s.add(q)
    plan = s.plan()
    assert plan.encode == tuple(seqs) and plan.encode_tokens == 11 * 3      # padded to the longest source
    assert plan.prefill == () and [c.seq for c in plan.tails] == seqs        # no call of their own
    assert [q.slot for q in seqs] == [0, 1, 2]
    execute(s, plan)
    assert all(q.status is Status.DECODING and q.computed == 1 for q in seqs)
    assert s.plan().encode == ()                                            # encoded once


def test_a_source_arriving_mid_run_joins_the_running_decode_call() -> None:
    s = make(chunk=16)
    running = source(6)
    s.add(running)
    execute(s, s.plan())
    late = source(9)
    s.add(late)
    plan = s.plan()
    assert plan.decode == (running,) and plan.encode == (late,) and [c.seq for c in plan.tails] == [late]
    execute(s, plan)
    assert s.plan().decode == (running, late)


def test_padded_source_tokens_count_against_the_budget_and_a_lone_long_source_still_goes() -> None:
    s = make(chunk=20, max_prefill=20)
    s.add(source(3))
    execute(s, s.plan())
    a, b = source(12), source(12)
    for q in (a, b):
        s.add(q)
    plan = s.plan()
    assert plan.encode == (a,) and b.status is Status.WAITING     # 2 x 12 source tokens + 2 start tokens > 20
    execute(s, plan)
    assert s.plan().encode == (b,)                                 # next iteration
    narrow = make(chunk=20, max_prefill=20)
    narrow.add(source(3))
    execute(narrow, narrow.plan())
    c, d = source(9), source(4)
    for q in (c, d):
        narrow.add(q)
    plan = narrow.plan()
    assert plan.encode == (c, d) and plan.encode_tokens == 18     # 2 x 9 + 2 start tokens <= 20: together
    lone = make(chunk=8, max_prefill=8)
    big = source(30)
    lone.add(big)
    assert lone.plan().encode == (big,)               # a source is never cut: alone, it goes whatever its length


def _plan_beside(running: list[SeqState], arrivals: list[SeqState]):
    """The plan for `arrivals` while `running` decode (8 slots, chunk budget 8, large budget 64)."""
    s = make(slots=8, chunk=8, max_prefill=64)
    for q in running:
        s.add(q)
    execute(s, s.plan())
    for q in arrivals:
        s.add(q)
    return s.plan()


def test_waiting_sources_fill_the_free_slots_at_the_large_budget_while_others_decode() -> None:
    """A source is never cut, so the chunk budget would admit one an iteration; sources take max_prefill_tokens."""
    running, arrivals = [source(4) for _ in range(5)], [source(10) for _ in range(4)]
    plan = _plan_beside(running, arrivals)
    assert plan.decode == tuple(running)
    assert plan.encode == tuple(arrivals[:3]) and arrivals[3].status is Status.WAITING   # 3 free slots, all taken
    assert plan.encode_tokens == 3 * 10 <= 64
    # A decoder's prompts beside decoding keep the chunk budget: 10 tokens go as 2 chunks of 5, the rest wait.
    prompts = [SeqState(10) for _ in range(3)]
    plan = _plan_beside([SeqState(4) for _ in range(5)], prompts)
    assert [c.seq for call in plan.prefill for c in call.chunks] == [prompts[0]] and plan.prefill[0].width == 5
    assert prompts[1].status is Status.WAITING and prompts[2].status is Status.WAITING


def test_a_beam_gang_is_admitted_into_free_slots_together_or_waits_and_blocks_the_queue() -> None:
    s = make(slots=4)
    one = source(4)
    s.add(one)
    execute(s, s.plan())                              # 3 slots free
    beams = [source(5, gang=4)] + [SeqState(1) for _ in range(3)]
    behind = source(2)
    for q in (*beams, behind):
        s.add(q)
    plan = s.plan()
    assert plan.encode == () and plan.tails == () and all(q.status is Status.WAITING for q in beams)
    assert behind.status is Status.WAITING            # first come, first served: it does not overtake the gang
    s.finish(one)
    plan = s.plan()
    assert [c.seq for c in plan.tails] == beams and plan.encode == (beams[0],)    # one source for all four
    assert sorted(q.slot for q in beams) == [0, 1, 2, 3] and behind.status is Status.WAITING
    execute(s, plan)
    assert s.plan().decode == tuple(beams)            # every beam steps in the same iteration


def test_sequences_with_a_source_reuse_no_prefix_even_with_reuse_on() -> None:
    s = make(reuse=True)
    first = source(6)
    s.add(first)
    execute(s, s.plan())
    s.finish(first)
    again = source(6)                                 # same start token, maybe the same source: nothing reused
    s.add(again)
    plan = s.plan()
    assert plan.copies == () and plan.reused_tokens == 0 and plan.encode == (again,)


def test_reordering_keeps_every_beams_slot_holding_its_own_hypothesis() -> None:
    """Slots simulated as token lists: after each step's copies, the rows in beam b's slot are exactly the inputs
    of the hypothesis beam b now holds (start token + all its tokens but the newest, which is the next input)."""
    k, vocab = 4, 7
    search = BeamSearch([BeamRequest()], BeamOptions(num_beams=k, length_penalty=1.0, early_stopping=False,
                                                  max_new_tokens=12, eos_id=None), vocab, tokenizer=None)
    slots = [5, 1, 6, 3]
    for beam, slot in zip(search.beams, slots):
        beam.state = SeqState(1, slot=slot)
    held: dict[int, list[int]] = {slot: [] for slot in slots}     # the inputs whose rows a slot holds
    rng = np.random.default_rng(0)
    copied = 0
    for step in range(8):
        inputs = {b.slot: (search.prompt_ids + search.tokens[b.index])[-1] for b in search.beams}
        for slot, token in inputs.items():
            held[slot] = held[slot] + [token]                      # the decode call writes each slot's input
        written = step + 1
        copies = search.step({b.index: rng.normal(size=vocab) * 3 for b in search.beams}, written)
        sources = {c.source for c in copies}
        assert not sources & {c.target for c in copies}            # no copy reads a slot another one writes
        snapshot = {slot: list(rows) for slot, rows in held.items()}
        for c in copies:
            assert c.length == written
            held[c.target] = snapshot[c.source][:c.length]
        copied += len(copies)
        for b in search.beams:
            assert held[b.slot] == (search.prompt_ids + search.tokens[b.index])[:-1]
    assert copied > 0

