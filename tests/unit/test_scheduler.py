"""The slot scheduler on its own: plans only, no onnxruntime, no model."""
from __future__ import annotations

import pytest

from server.generation.scheduler import Copy, Scheduler, SchedulerConfig, SeqState, Status
from tests.scheduler_plans import execute


def make(slots: int = 4, chunk: int = 8, max_prefill: int = 64) -> Scheduler:
    return Scheduler(SchedulerConfig(num_slots=slots, chunk_tokens=chunk, max_prefill_tokens=max_prefill))


def test_arrivals_of_the_same_instant_are_prefilled_together_in_consecutive_slots() -> None:
    s = make()
    seqs = [SeqState(n) for n in (5, 11, 3)]
    for q in seqs:
        s.add(q)
    plan = s.plan()
    assert plan.decode == ()
    assert len(plan.prefill) == 1
    call = plan.prefill[0]
    assert call.first_prompt and call.width == 11 and call.padded_tokens == 33
    assert [c.seq.slot for c in call.chunks] == [0, 1, 2]
    assert [(c.start, c.length) for c in call.chunks] == [(0, 5), (0, 11), (0, 3)]
    execute(s, plan)
    assert all(q.status is Status.DECODING and q.computed == q.prompt_len for q in seqs)
    assert s.plan().decode == tuple(seqs)


def test_a_long_prompt_beside_running_streams_is_cut_into_chunks_and_streams_keep_decoding() -> None:
    s = make(chunk=8)
    running = SeqState(4)
    s.add(running)
    execute(s, s.plan())
    long = SeqState(30)
    s.add(long)
    lengths = []
    while long.status is not Status.DECODING:
        plan = s.plan()
        assert plan.decode[0] is running             # the stream decodes in every iteration
        assert plan.prefill_tokens <= 8              # and the prompt never takes more than a chunk
        lengths += [c.length for call in plan.prefill for c in call.chunks]
        execute(s, plan)
    assert lengths == [8, 8, 7, 7]                   # the fewest chunks that fit, of equal size
    assert long.computed == 30 and running.computed == 4 + 4


def test_continuation_chunks_run_alone_and_first_chunks_start_at_zero() -> None:
    s = make(chunk=8)
    s.add(SeqState(2))
    s.add(SeqState(2))
    execute(s, s.plan())                             # two streams: two arrivals get a chunk at a time
    a, b = SeqState(20), SeqState(20)
    s.add(a)
    s.add(b)
    plan = s.plan()
    # a takes the whole budget; b waits for a budget of its own rather than starting on scraps
    assert [(c.seq, c.start, c.length) for call in plan.prefill for c in call.chunks] == [(a, 0, 7)]
    execute(s, plan)
    plan = s.plan()
    assert len(plan.prefill) == 1 and not plan.prefill[0].first_prompt
    assert [(c.seq, c.start, c.length) for c in plan.prefill[0].chunks] == [(a, 7, 7)]
    assert b.status is Status.WAITING


def test_a_prompt_over_the_budget_is_cut_into_equal_chunks_never_over_it() -> None:
    s = make(chunk=8)
    s.add(SeqState(1))
    execute(s, s.plan())
    for length, expected in ((8, [8]), (9, [5, 4]), (17, [6, 6, 5]), (24, [8, 8, 8]), (25, [7, 6, 6, 6])):
        q = SeqState(length)
        s.add(q)
        lengths = []
        while q.status is not Status.DECODING:
            plan = s.plan()
            lengths += [c.length for call in plan.prefill for c in call.chunks]
            execute(s, plan)
        assert lengths == expected, length
        s.finish(q)


def test_a_lone_prompt_uses_the_large_budget() -> None:
    s = make(chunk=8, max_prefill=64)
    q = SeqState(50)
    s.add(q)
    plan = s.plan()
    assert plan.prefill_tokens == 50 and q.slot == 0


def test_padding_counts_against_the_budget() -> None:
    s = make(slots=8, chunk=8, max_prefill=40)
    seqs = [SeqState(n) for n in (30, 2, 2)]
    for q in seqs:
        s.add(q)
    plan = s.plan()
    # 30 + a second row would be 2 x 30 = 60 padded tokens > 40: the short ones wait one iteration.
    assert [c.seq for call in plan.prefill for c in call.chunks] == [seqs[0]]
    execute(s, plan)
    plan = s.plan()
    # Now one sequence decodes (budget: a chunk of 8); the two 2-token prompts need 2 x 2 = 4: together.
    assert [c.seq for call in plan.prefill for c in call.chunks] == seqs[1:]
    assert plan.decode == (seqs[0],)


def test_slot_reuse_after_a_sequence_leaves_and_no_one_moves() -> None:
    s = make(slots=3)
    seqs = [SeqState(4) for _ in range(3)]
    for q in seqs:
        s.add(q)
    execute(s, s.plan())
    assert [q.slot for q in seqs] == [0, 1, 2]
    late = SeqState(6)
    s.add(late)
    assert s.plan().prefill == ()                # no free slot: it waits
    s.finish(seqs[1])
    assert seqs[1].status is Status.FINISHED and seqs[1].slot is None and s.free_slots == 1
    plan = s.plan()
    assert [c.seq.slot for call in plan.prefill for c in call.chunks] == [1]
    assert seqs[0].slot == 0 and seqs[2].slot == 2   # the others kept their slots


def test_cancellation_mid_prefill_frees_the_slot_at_once() -> None:
    s = make(slots=2, chunk=4)
    s.add(SeqState(2))
    execute(s, s.plan())
    long = SeqState(40)
    s.add(long)
    execute(s, s.plan())
    assert long.status is Status.PREFILLING and long.computed == 4 and long.slot == 1
    s.finish(long)
    assert long.status is Status.FINISHED and s.free_slots == 1
    plan = s.plan()
    assert plan.prefill == () and len(plan.decode) == 1
    nxt = SeqState(3)
    s.add(nxt)
    plan = s.plan()
    assert [(c.seq, c.start, c.length) for call in plan.prefill for c in call.chunks] == [(nxt, 0, 3)]
    assert nxt.slot == 1


def test_a_waiting_sequence_can_leave_and_a_finished_one_is_ignored() -> None:
    s = make(slots=1)
    a, b = SeqState(3), SeqState(3)
    s.add(a)
    s.add(b)
    s.finish(b)
    assert list(s.waiting) == [a]
    s.finish(b)                                  # twice: no error
    execute(s, s.plan())
    s.finish(a)
    assert s.free_slots == 1 and s.plan().empty


def test_first_prompt_groups_split_on_non_consecutive_slots() -> None:
    s = make(slots=4, chunk=16, max_prefill=100)
    first = [SeqState(2) for _ in range(4)]
    for q in first:
        s.add(q)
    execute(s, s.plan())
    s.finish(first[0])
    s.finish(first[2])
    new = [SeqState(3), SeqState(5)]
    for q in new:
        s.add(q)
    plan = s.plan()
    groups = [[c.seq.slot for c in call.chunks] for call in plan.prefill]
    assert groups == [[0], [2]] and all(call.first_prompt for call in plan.prefill)


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="chunk_tokens"):
        SchedulerConfig(num_slots=2, chunk_tokens=0)
    with pytest.raises(ValueError, match="num_slots"):
        SchedulerConfig(num_slots=True)


# ---------------------------------------------------------------------- prefix reuse


def reusing(slots: int = 4, chunk: int = 8, max_prefill: int = 64, min_reuse: int = 4,
            slot_length: int = 1 << 30) -> Scheduler:
    return Scheduler(SchedulerConfig(num_slots=slots, chunk_tokens=chunk, max_prefill_tokens=max_prefill,
                                     prefix_reuse=True, min_reuse_tokens=min_reuse, slot_length=slot_length))


def run_to_decoding(s: Scheduler, *seqs: SeqState) -> None:
    for q in seqs:
        s.add(q)
    while any(q.status is not Status.DECODING for q in seqs):
        execute(s, s.plan())


def test_a_free_slot_keeps_its_tokens_and_a_prompt_starting_with_them_prefills_only_the_rest() -> None:
    s = reusing()
    a = SeqState.of(list(range(10)))
    run_to_decoding(s, a)
    for token in (100, 101):                     # two decode steps write the tokens fed
        s.decoded(a, token)
    s.finish(a)
    assert s.free_write_positions() == {0: 12}   # throw-away writes go past the 12 held tokens
    b = SeqState.of(list(range(10)) + [100, 101, 7, 8])
    s.add(b)
    plan = s.plan()
    assert plan.copies == ()                     # the lowest free slot is the one holding them
    assert [(c.seq, c.start, c.length) for call in plan.prefill for c in call.chunks] == [(b, 12, 2)]
    assert not plan.prefill[0].first_prompt and plan.reused_tokens == 12
    assert b.slot == 0 and b.computed == 12 and b.reused == 12
    assert s.free_write_positions() == {}        # the slot is owned again: nothing held


def test_a_prefix_held_by_another_free_slot_is_copied_into_the_lowest_one() -> None:
    s = reusing(slots=3)
    keep, x, y = SeqState.of([1] * 6), SeqState.of([2] * 6), SeqState.of([3] * 9)
    run_to_decoding(s, keep, x, y)
    assert [q.slot for q in (keep, x, y)] == [0, 1, 2]
    s.finish(y)
    s.finish(x)
    assert s.free_write_positions() == {1: 6, 2: 9}
    b = SeqState.of([3] * 9 + [4, 4])
    s.add(b)
    plan = s.plan()
    assert b.slot == 1 and plan.copies == (Copy(source=2, target=1, length=9),)
    assert [(c.start, c.length) for call in plan.prefill for c in call.chunks] == [(9, 2)]
    assert s.free_write_positions() == {2: 9}    # the source keeps its tokens; slot 1's old ones are gone
    assert plan.decode == (keep,)


def test_the_last_prompt_token_is_always_run_and_short_prefixes_are_not_reused() -> None:
    s = reusing(min_reuse=4)
    a = SeqState.of([5, 6, 7, 8, 9])
    run_to_decoding(s, a)
    s.finish(a)
    same = SeqState.of([5, 6, 7, 8, 9])          # the whole prompt is held: its last token still runs ...
    s.add(same)
    plan = s.plan()
    assert plan.prefill == () and same.reused == 4
    assert [(c.seq, c.start, c.length) for c in plan.tails] == [(same, 4, 1)]   # ... as a row of the decode call
    execute(s, plan)
    s.finish(same)
    short = SeqState.of([5, 6, 7, 0, 0])         # 3 tokens in common < min_reuse_tokens
    s.add(short)
    plan = s.plan()
    assert plan.prefill[0].first_prompt and short.reused == 0 and plan.reused_tokens == 0
    assert [(c.start, c.length) for call in plan.prefill for c in call.chunks] == [(0, 5)]


def test_the_longest_held_prefix_wins_and_arrivals_still_group() -> None:
    s = reusing(slots=4, min_reuse=3)
    a, b = SeqState.of([1, 2, 3, 4, 0, 0]), SeqState.of([1, 2, 3, 4, 5, 6, 0])
    run_to_decoding(s, a, b)
    s.finish(a)
    s.finish(b)
    hit = SeqState.of([1, 2, 3, 4, 5, 6, 7, 8])
    miss1, miss2 = SeqState.of([9] * 4), SeqState.of([8] * 3)
    for q in (miss1, hit, miss2):
        s.add(q)
    plan = s.plan()
    assert hit.reused == 6 and plan.reused_tokens == 6
    # Slots are taken lowest first: miss1 -> 0, hit -> 1 (holding its 6 tokens already), miss2 -> 2.
    assert (miss1.slot, hit.slot, miss2.slot) == (0, 1, 2) and plan.copies == ()
    calls = [[(c.seq, c.start, c.length) for c in call.chunks] for call in plan.prefill]
    assert [(hit, 6, 2)] in calls                # the hit continues alone ...
    assert [(miss1, 0, 4)] in calls and [(miss2, 0, 3)] in calls   # ... the others start at 0 (slots 0 and 2)


def test_what_a_failed_or_untracked_sequence_held_is_not_remembered() -> None:
    s = reusing()
    failed, anonymous = SeqState.of(list(range(8))), SeqState(8)
    run_to_decoding(s, failed, anonymous)
    s.finish(failed, reusable=False)
    s.finish(anonymous)                          # no tokens tracked: nothing to match against
    assert s.free_write_positions() == {}
    off = make()                                 # prefix_reuse off (the scheduler's default)
    q = SeqState.of(list(range(8)))
    run_to_decoding(off, q)
    off.finish(q)
    assert off.free_write_positions() == {}


def test_a_held_prefix_leaves_the_slots_last_position_free() -> None:
    s = reusing(slot_length=10)
    a = SeqState.of(list(range(8)))
    run_to_decoding(s, a)
    s.decoded(a, 50)
    s.decoded(a, 51)                             # the slot is full: 10 of 10 positions
    s.finish(a)
    assert s.free_write_positions() == {0: 9}    # 9 remembered, position 9 takes throw-away writes


def test_common_prefix_agrees_with_a_plain_loop() -> None:
    import random

    from server.generation.scheduler import _common_prefix

    rng = random.Random(0)
    for _ in range(500):
        n = rng.randrange(0, 40)
        a = [rng.randrange(3) for _ in range(n)]
        b = a[:rng.randrange(0, n + 1)] + [rng.randrange(3) for _ in range(rng.randrange(0, 10))]
        want = 0
        while want < min(len(a), len(b)) and a[want] == b[want]:
            want += 1
        assert _common_prefix(a, b) == want


def test_a_prompt_starting_with_a_running_sequences_tokens_copies_them_from_its_slot() -> None:
    s = reusing(slots=3, min_reuse=4)
    a = SeqState.of(list(range(10)))
    run_to_decoding(s, a)                        # slot 0
    s.decoded(a, 50)                             # 11 tokens in the slot: the prompt and the first one fed back
    b = SeqState.of(list(range(10)) + [50, 60, 61])
    s.add(b)
    plan = s.plan()
    assert plan.decode == (a,) and b.slot == 1   # a keeps decoding; it writes only past its 11 tokens
    assert plan.copies == (Copy(source=0, target=1, length=11),)
    assert [(c.seq, c.start, c.length) for call in plan.prefill for c in call.chunks] == [(b, 11, 2)]
    assert plan.reused_tokens == 11 and b.reused == 11


def test_a_prompt_that_a_running_sequence_is_still_prefilling_waits_for_it_then_copies_it() -> None:
    s = reusing(slots=3, chunk=8, min_reuse=4)
    streaming = SeqState.of([9, 9])
    run_to_decoding(s, streaming)                # someone decodes: prompts go in chunks of at most 8
    a = SeqState.of(list(range(20)))
    s.add(a)
    execute(s, s.plan())
    b = SeqState.of(list(range(20)) + [7, 7])
    s.add(b)
    while a.status is Status.PREFILLING:
        plan = s.plan()
        # b shares 20 tokens with a and would compute again the ones a has not: it waits (nothing else does)
        assert b.status is Status.WAITING and [c.seq for call in plan.prefill for c in call.chunks] == [a]
        execute(s, plan)
    plan = s.plan()
    assert b.slot == 2 and plan.copies == (Copy(source=1, target=2, length=20),)
    assert [(c.seq, c.start, c.length) for call in plan.prefill for c in call.chunks] == [(b, 20, 2)]


def test_identical_prompts_sent_together_are_prefilled_once_and_the_others_ride_the_decode_call() -> None:
    """OpenAI's n completions of one prompt: the first is prefilled, the others wait one iteration, then take a
    copy of its prompt but the last token, which runs as a row of the decode call (no call of its own)."""
    s = reusing(slots=4, min_reuse=4)
    sibs = [SeqState.of(list(range(12))) for _ in range(3)]
    for q in sibs:
        s.add(q)
    plan = s.plan()
    assert [c.seq for call in plan.prefill for c in call.chunks] == [sibs[0]] and plan.tails == ()
    assert sibs[1].status is sibs[2].status is Status.WAITING
    execute(s, plan)
    plan = s.plan()
    assert plan.decode == (sibs[0],) and plan.prefill == ()
    assert plan.copies == (Copy(source=0, target=1, length=11), Copy(source=0, target=2, length=11))
    assert [(c.seq, c.start, c.length) for c in plan.tails] == [(sibs[1], 11, 1), (sibs[2], 11, 1)]
    assert plan.reused_tokens == 22 and plan.prefill_tokens == 2
    execute(s, plan)
    assert [(q.status, q.computed) for q in sibs] == [(Status.DECODING, 13), (Status.DECODING, 12),
                                                      (Status.DECODING, 12)]


def test_without_prefix_reuse_identical_prompts_go_together_and_nothing_is_copied() -> None:
    s = make()
    sibs = [SeqState.of(list(range(12))) for _ in range(3)]
    for q in sibs:
        s.add(q)
    plan = s.plan()
    assert [c.seq for call in plan.prefill for c in call.chunks] == sibs and plan.copies == ()


def test_a_one_token_prompt_rides_the_decode_call_unless_it_arrived_with_others() -> None:
    s = make()
    a = SeqState(5)
    s.add(a)
    execute(s, s.plan())
    one = SeqState(1)
    s.add(one)
    plan = s.plan()
    assert plan.decode == (a,) and plan.prefill == ()
    assert [(c.seq, c.start, c.length) for c in plan.tails] == [(one, 0, 1)] and plan.prefill_tokens == 1
    execute(s, plan)
    assert one.status is Status.DECODING and one.computed == 1
    alone = make()                               # nobody decodes: the decode call carries just this row
    q = SeqState(1)
    alone.add(q)
    plan = alone.plan()
    assert not plan.empty and plan.decode == () and [c.seq for c in plan.tails] == [q]
    together = make()                            # arrivals of one instant stay one first-prompt call
    pair = [SeqState(1), SeqState(5)]
    for q in pair:
        together.add(q)
    plan = together.plan()
    assert plan.tails == () and [c.seq for call in plan.prefill for c in call.chunks] == pair


def test_when_more_requests_wait_than_decode_they_are_admitted_together_with_the_large_budget() -> None:
    s = make(slots=8, chunk=8, max_prefill=64)
    early = [SeqState(6) for _ in range(2)]
    for q in early:
        s.add(q)
    execute(s, s.plan())                         # 2 decoding
    burst = [SeqState(6) for _ in range(3)]      # 3 > 2: worth one longer step
    for q in burst:
        s.add(q)
    plan = s.plan()
    assert plan.decode == tuple(early)
    assert [c.seq for call in plan.prefill for c in call.chunks] == burst and plan.prefill_tokens == 18
    execute(s, plan)
    pair = [SeqState(6) for _ in range(2)]       # 2 <= 5 decoding: a chunk of 8 at a time again
    for q in pair:
        s.add(q)
    assert s.plan().prefill_tokens == 6


def test_waiting_requests_without_free_slots_do_not_widen_the_budget() -> None:
    s = make(slots=3, chunk=8, max_prefill=64)
    s.add(SeqState(4))
    execute(s, s.plan())
    long = SeqState(40)
    s.add(long)
    execute(s, s.plan())                         # 1 waiting <= 1 decoding: its first chunk of 8
    assert long.computed == 8
    for _ in range(5):                           # they cannot be admitted: one free slot only
        s.add(SeqState(4))
    plan = s.plan()
    assert [(c.seq, c.length) for call in plan.prefill for c in call.chunks][0] == (long, 8)


def test_a_burst_of_one_prompt_is_prefilled_once_and_the_rest_join_in_one_decode_call() -> None:
    """32 identical prompts at once (a benchmark client, or n = 32): one prefill; the next iteration copies the
    prompt into the other 31 slots and their last tokens are 31 rows of the one decode call."""
    s = reusing(slots=32, chunk=8, max_prefill=64, min_reuse=4)
    burst = [SeqState.of(list(range(40))) for _ in range(32)]
    for q in burst:
        s.add(q)
    plan = s.plan()
    assert [c.seq for call in plan.prefill for c in call.chunks] == [burst[0]] and len(s.waiting) == 31
    execute(s, plan)
    plan = s.plan()
    assert plan.decode == (burst[0],) and plan.prefill == () and len(plan.copies) == 31
    assert [c.seq for c in plan.tails] == burst[1:] and plan.reused_tokens == 31 * 39
    execute(s, plan)
    assert all(q.status is Status.DECODING for q in burst) and not s.waiting


def test_reserved_tokens_follow_membership_through_admission_and_finish() -> None:
    """Admission control reads the tokens its waiting and running sequences may hold; the scheduler keeps that
    sum as they come and go (it was summed over every sequence per request)."""
    s = make(slots=1)
    a, b, c = SeqState(4, reserve=40), SeqState(6, reserve=60), SeqState(2, reserve=25)
    for q in (a, b, c):
        s.add(q)
    assert s.reserved == 125
    execute(s, s.plan())                       # a runs, b and c wait: all still count
    assert a.status is Status.DECODING and s.reserved == 125
    s.finish(a)
    s.finish(a)                                # finishing twice subtracts once
    assert s.reserved == 85
    s.finish(c)                                # a waiting one leaves too
    assert s.reserved == 60 and list(s.waiting) == [b]
