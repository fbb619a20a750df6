"""The running rows' array state (slot_state.py) against the per-sequence rules it replaced, in the scheduler tests'
style: a real Scheduler's plans, real Sequences (sampler, detokenizer, stop matcher) over a word-level tokenizer
built here, and tokens (or logits) written by hand; every expected finish reason, count and text is written out."""
from __future__ import annotations

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models

from server.generation.outputs import take_tokens
from server.generation.params import GenerationParams
from server.generation.results import StreamChunk
from server.generation.sampling import Choice
from server.generation.scheduler import Scheduler, SchedulerConfig, SeqState
from server.generation.sequence import Sequence
from server.generation.slot_state import DEADLINE, EOS, GOES_ON, LENGTH, STOP, SlotState
from server.generation.strategies import StepContext, StepRow, plan_rows
from tests.scheduler_plans import execute

EOS_ID = 0
VOCAB = {"<eos>": EOS_ID, "a": 1, "b": 2, "c": 3, "d": 4, "x": 5, "y": 6}
A, B, C, D, X, Y = 1, 2, 3, 4, 5, 6


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    """One token per letter; the decoder joins them (no spaces); eos is a special token."""
    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="x"))
    tok.add_special_tokens([AddedToken("<eos>", special=True)])
    tok.decoder = decoders.Fuse()
    return tok


class Engine:
    """What the loop does around the arrays, by hand: a scheduler with its slots, the array state written from its
    plans, and each step's tokens taken all at once (outputs.take_tokens)."""

    def __init__(self, tokenizer: Tokenizer, slots: int = 4, max_length: int = 64) -> None:
        self.tokenizer = tokenizer
        self.scheduler = Scheduler(SchedulerConfig(num_slots=slots, chunk_tokens=16, max_prefill_tokens=64))
        self.rows = SlotState(slots, EOS_ID, max_length)
        self.counted: list[Sequence] = []

    def start(self, prompt: list[int], deadline: float | None = None, **params) -> SeqState:
        seq = Sequence.create(prompt, GenerationParams.validate(**params), self.tokenizer, len(VOCAB), deadline,
                              eos_id=EOS_ID)
        state = SeqState.of(prompt, owner=seq)
        seq.state = state
        self.scheduler.add(state)
        plan = self.scheduler.plan()
        self.rows.admit_plan(plan)         # written at admission, as the loop does
        execute(self.scheduler, plan)
        return state

    def step(self, tokens: dict[SeqState, int], logprobs: dict[SeqState, Choice] | None = None) -> None:
        """One iteration: these rows took these tokens (a Choice from `logprobs` where given)."""
        for state in tokens:
            if state.owner.generated:
                self.scheduler.decoded(state, state.owner.generated[-1])
        choices = {s: (logprobs or {}).get(s, Choice(t, None, ())) for s, t in tokens.items()}
        take_tokens(list(choices.items()), self.rows, self.tokenizer, self.counted.append)

    def finish(self, state: SeqState) -> None:
        self.rows.free(state.slot)
        self.scheduler.finish(state)


def chunks(seq: Sequence) -> list[StreamChunk]:
    out = []
    while not seq.queue.empty():
        out.append(seq.queue.get_nowait())
    return out


def answer(seq: Sequence) -> tuple[str, str | None, list[int], list[int]]:
    """(text, finish reason, ids generated, ids in the output's token list)."""
    got = chunks(seq)
    return ("".join(c.text for c in got), seq.finish_reason, list(seq.generated),
            [t.token_id for c in got for t in c.tokens])


# ---------------------------------------------------------------- the rule on its own

class Owner:
    """What admission reads of a sequence's owner."""

    def __init__(self, params: GenerationParams, deadline: float | None = None) -> None:
        self.params, self.deadline, self.generated = params, deadline, []


def test_the_rule_reads_each_rows_own_stop_set_and_budget() -> None:
    rows = SlotState(4, EOS_ID, max_length=10)
    states = [SeqState.of([X] * 3, owner=Owner(GenerationParams.validate(max_new_tokens=5, stop_token_ids=ids)))
              for ids in ([D], [], [C, D], [])]
    for slot, state in enumerate(states):
        state.slot = slot
        rows.admit(state)
    slots = np.arange(4)
    assert rows.ends(slots, np.array([D, D, D, A])).tolist() == [STOP, GOES_ON, STOP, GOES_ON]
    assert rows.ends(slots, np.array([EOS_ID, C, C, B])).tolist() == [EOS, GOES_ON, STOP, GOES_ON]
    # As its 5th token (4 ahead of none taken): max_new_tokens; eos still says eos first.
    assert rows.ends(slots, np.array([A, EOS_ID, A, A]), ahead=4).tolist() == [LENGTH, EOS, LENGTH, LENGTH]


def test_ignore_eos_and_min_tokens_in_the_rule() -> None:
    rows = SlotState(3, EOS_ID, max_length=100)
    params = [dict(), dict(ignore_eos=True), dict(min_tokens=2, stop_token_ids=[D])]
    for slot, kw in enumerate(params):
        state = SeqState.of([X], owner=Owner(GenerationParams.validate(max_new_tokens=50, **kw)))
        state.slot = slot
        rows.admit(state)
    slots = np.arange(3)
    assert rows.ends(slots, np.array([EOS_ID, EOS_ID, EOS_ID])).tolist() == [EOS, GOES_ON, GOES_ON]  # 1st token
    assert rows.ends(slots, np.array([D, D, D])).tolist() == [GOES_ON, GOES_ON, GOES_ON]
    # From the min_tokens-th on (the sampler masks them up to it: only a forced token meets this one).
    assert rows.ends(slots, np.array([D, D, D]), ahead=1).tolist() == [GOES_ON, GOES_ON, STOP]       # 2nd
    assert rows.ends(slots, np.array([A, A, EOS_ID]), ahead=2).tolist() == [GOES_ON, GOES_ON, EOS]   # 3rd


def test_the_workers_look_ahead_equals_the_loops_steps() -> None:
    """The multi-step run checks tokens the loop has not taken (ahead = k): the same answers as taking them."""
    rows = SlotState(2, EOS_ID, max_length=100)
    for slot, kw in enumerate([dict(max_new_tokens=3), dict(max_new_tokens=9, stop_token_ids=[C])]):
        state = SeqState.of([X, X], owner=Owner(GenerationParams.validate(**kw)))
        state.slot = slot
        rows.admit(state)
    slots = np.arange(2)
    run = [np.array([A, A]), np.array([B, B]), np.array([A, C])]
    ahead = [rows.ends(slots, tokens, ahead=k).tolist() for k, tokens in enumerate(run)]
    taken = [rows.take(slots, tokens).tolist() for tokens in run]
    assert ahead == taken == [[GOES_ON, GOES_ON], [GOES_ON, GOES_ON], [LENGTH, STOP]]
    assert rows.generated[:2].tolist() == [3, 3] and rows.position[:2].tolist() == [5, 5]


def test_deadlines_are_read_from_the_arrays() -> None:
    rows = SlotState(3, EOS_ID, max_length=100)
    for slot, deadline in enumerate([10.0, None, 30.0]):
        state = SeqState.of([X], owner=Owner(GenerationParams.validate(), deadline))
        state.slot = slot
        rows.admit(state)
    assert rows.ends(np.arange(3), np.array([A, A, A]), now=20.0).tolist() == [DEADLINE, GOES_ON, GOES_ON]
    # A token that ends its row says why, whatever the deadline; and a freed slot has no deadline.
    assert rows.ends(np.arange(3), np.array([EOS_ID, A, A]), now=40.0).tolist() == [EOS, GOES_ON, DEADLINE]
    rows.free(0)
    assert rows.ends(np.arange(3), np.array([A, A, A]), now=40.0).tolist() == [GOES_ON, GOES_ON, DEADLINE]


# ---------------------------------------------------------------- the array path against the old per-row rules

def test_stop_token_ids_end_without_their_text(tokenizer: Tokenizer) -> None:
    e = Engine(tokenizer)
    s = e.start([X, X], stop_token_ids=[D])
    for token in (A, B, D):
        e.step({s: token})
    assert answer(s.owner) == ("ab", "stop", [A, B, D], [A, B, D])


def test_eos_ends_and_ignore_eos_keeps_it_as_text(tokenizer: Tokenizer) -> None:
    e = Engine(tokenizer)
    plain, ignoring = e.start([X], max_new_tokens=3), e.start([X], max_new_tokens=3, ignore_eos=True)
    e.step({plain: A, ignoring: A})
    e.step({plain: EOS_ID, ignoring: EOS_ID})
    e.step({plain: B, ignoring: B})        # plain ended: its row is passed over
    assert answer(plain.owner) == ("a", "eos", [A, EOS_ID], [A, EOS_ID])
    assert answer(ignoring.owner) == ("a<eos>b", "length", [A, EOS_ID, B], [A, EOS_ID, B])
    assert len(e.counted) == 5


def test_max_new_tokens_and_the_context_cap(tokenizer: Tokenizer) -> None:
    e = Engine(tokenizer, max_length=6)
    budget = e.start([X], max_new_tokens=3)
    capped = e.start([X, X, X, X], max_new_tokens=10)   # its 1st token goes at 4, its 3rd would go at 6
    for token in (A, B, C):
        e.step({budget: token, capped: token})
    assert answer(budget.owner) == ("abc", "length", [A, B, C], [A, B, C])
    assert answer(capped.owner) == ("abc", "length", [A, B, C], [A, B, C])


def test_stop_strings_end_on_the_text_and_later_tokens_are_dropped(tokenizer: Tokenizer) -> None:
    e = Engine(tokenizer)
    s = e.start([X], stop=["bc"], max_new_tokens=10)
    for token in (A, B, C, D):
        e.step({s: token})
    # b begins the stop string and is cut with it; d came after the end (a run's look-ahead): dropped.
    assert answer(s.owner) == ("a", "stop", [A, B, C], [A])
    assert e.rows.generated[s.slot] == 3


def test_n_sequences_of_a_request_end_each_by_its_own_row(tokenizer: Tokenizer) -> None:
    e = Engine(tokenizer)
    first, second = e.start([X, Y], max_new_tokens=3), e.start([X, Y], max_new_tokens=3)
    assert (first.slot, second.slot) == (0, 1)
    e.step({first: A, second: B})
    e.step({first: EOS_ID, second: C})
    e.finish(first)                                     # its slot leaves the arrays with it
    e.step({second: D})
    assert answer(first.owner) == ("a", "eos", [A, EOS_ID], [A, EOS_ID])
    assert answer(second.owner) == ("bcd", "length", [B, C, D], [B, C, D])
    assert e.rows.holder[:2] == [None, second]


def test_a_later_request_in_a_freed_slot_gets_a_fresh_row(tokenizer: Tokenizer) -> None:
    e = Engine(tokenizer, slots=1)
    old = e.start([X], max_new_tokens=2, stop_token_ids=[C])
    e.step({old: A})
    e.step({old: B})
    e.finish(old)
    new = e.start([X, X, X], max_new_tokens=4)
    assert new.slot == 0
    for token in (C, C, C, C):
        e.step({new: token})
    assert answer(new.owner) == ("cccc", "length", [C, C, C, C], [C, C, C, C])


def test_logprobs_travel_with_their_tokens_and_the_ending_one(tokenizer: Tokenizer) -> None:
    e = Engine(tokenizer)
    s = e.start([X], logprobs=True, top_logprobs=1)
    e.step({s: A}, {s: Choice(A, -0.25, ((A, -0.25),))})
    e.step({s: EOS_ID}, {s: Choice(EOS_ID, -0.5, ((B, -0.4),))})
    got = [t for c in chunks(s.owner) for t in c.tokens]
    assert s.owner.finish_reason == "eos"
    assert [(t.token_id, t.token, t.logprob) for t in got] == [(A, "a", -0.25), (EOS_ID, "<eos>", -0.5)]
    assert [[(a.token_id, a.token, a.logprob) for a in t.top_logprobs] for t in got] == [[(A, "a", -0.25)],
                                                                                       [(B, "b", -0.4)]]


# ---------------------------------------------------------------- the sampler's rules still apply on the way

def sample(e: Engine, states: list[SeqState], logits: list[float], steps: int) -> None:
    """Greedy steps over the same hand-written logits for every row: the rows' strategy chooses (their samplers'
    penalties and min_tokens), the arrays take."""
    context = StepContext(lambda x, n: (x, x))
    for _ in range(steps):
        live = [s for s in states if not s.owner.done]
        block = np.array([logits] * len(live), np.float32)
        planned = plan_rows([StepRow(s, block, i, s.computed + 1) for i, s in enumerate(live)], context)
        e.step({state: choice.token_id for state, choice in planned.choices})


# logits:      eos   a    b    c    d    x    y
LOGITS = [-5.0, 1.0, 0.8, 0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("params, text", [
    (dict(), "aaaa"),
    (dict(frequency_penalty=0.5), "abab"),           # a: 1.0, 0.5, 0.0 after each; b: 0.8, 0.3
    (dict(presence_penalty=1.5), "abcd"),            # once each: a -0.5, b -0.7, then c, d at 0 (lowest id first)
    (dict(repetition_penalty=2.0), "abaa"),          # a 1.0 -> 0.5 once seen, b 0.8 -> 0.4
])
def test_penalties_still_apply(tokenizer: Tokenizer, params: dict, text: str) -> None:
    e = Engine(tokenizer)
    s = e.start([Y], max_new_tokens=4, **params)
    sample(e, [s], LOGITS, 5)
    assert answer(s.owner)[:2] == (text, "length")


def test_min_tokens_holds_eos_back_then_eos_ends(tokenizer: Tokenizer) -> None:
    e = Engine(tokenizer)
    held, plain = e.start([Y], max_new_tokens=8, min_tokens=2), e.start([Y], max_new_tokens=8)
    eos_first = [3.0, 1.0, 0.8, 0.0, 0.0, 0.0, 0.0]
    sample(e, [held, plain], eos_first, 4)
    assert answer(held.owner) == ("aa", "eos", [A, A, EOS_ID], [A, A, EOS_ID])
    assert answer(plain.owner) == ("", "eos", [EOS_ID], [EOS_ID])



def test_a_runs_steps_taken_at_once_end_each_row_where_one_step_at_a_time_does(tokenizer: Tokenizer) -> None:
    """The loop applies a worker's run of steps in one call (outputs.take_steps): every row ends where applying the
    same steps one by one ends it — a stop string mid-run (its later tokens dropped), a stop id once min_tokens is
    reached, the budget — with the same text, tokens, counts and array state. The worker leaves a row it ended by
    id or budget out of later steps; a stop string only the loop sees, so its row's later tokens still come."""
    from server.generation.outputs import take_steps

    specs = [dict(max_new_tokens=10, stop=["bc"]), dict(max_new_tokens=10, stop_token_ids=[D], min_tokens=2),
             dict(max_new_tokens=3), dict(max_new_tokens=10)]
    run = [{0: A, 1: D, 2: A, 3: A}, {0: B, 1: D, 2: B, 3: B}, {0: C, 2: C, 3: C}, {0: X, 3: D}, {0: Y, 3: D}]
    one_by_one, at_once = Engine(tokenizer), Engine(tokenizer)
    answers, counts, taken = [], [], []
    for engine in (one_by_one, at_once):
        states = [engine.start([A], **spec) for spec in specs]
        steps = [[(states[r], Choice(t, None, ())) for r, t in step.items()] for step in run]
        if engine is one_by_one:
            for step in steps:
                engine.step({s: c.token_id for s, c in step if not s.owner.done})
        else:
            take_steps(steps, engine.rows, tokenizer, engine.counted.append)
        answers.append([answer(s.owner) for s in states])
        counts.append(len(engine.counted))
        taken.append(engine.rows.taken[states[3].slot])
    assert answers[1] == answers[0] == [
        ("a", "stop", [A, B, C], [A]),            # "bc" completes at its 3rd token: text and tokens cut before it
        ("d", "stop", [D, D], [D, D]),            # the second D ends it (min_tokens 2): listed, its text dropped
        ("abc", "length", [A, B, C], [A, B, C]),
        ("abcdd", None, [A, B, C, D, D], [A, B, C, D, D])]
    assert counts[1] == counts[0] and taken[1] == taken[0] == 5
