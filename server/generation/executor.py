"""The executor: runs one iteration's plan (scheduler.py) in the engine's worker thread.

`prepare` (on the event loop, where the scheduler's state lives) turns the plan into runner rows; `run` (in the
worker thread: onnxruntime and numpy release the GIL, the loop keeps serving) makes the calls over the slot
cache — prefix copies first, then the encoder step of sources admitted this iteration (encoder-decoder packages:
encoder_step.py), then the decode call (with the iteration's first prompt chunk in the same run when
the package has a mixed graph), then the other prefill calls, in this order (slot_runner.py says why) — and
then the work on their logits: every row that gets a next token this step (a decode row, or the last position of
a completed prompt) goes to its owner's strategy (strategies.plan_rows: all rows of one strategy at once; it never
asks which kind a row is), the slot copies the strategies ask for are made together, and the prompt tokens of
requests that asked are scored. What comes back is a typed outcome; the engine applies it on the loop (the
strategies' `Settle`s included).

A pure decode plan may come with a `Run` (GenerationConfig.decode_steps, decode_run_ms): the thread then feeds each
row's chosen token straight back as its next decode row, up to `steps` times and within `budget_s` (a short step
runs many times, a long one once), without returning to the loop.
The run ends before any row's token would end its sequence (slot_state.py, the rule the loop applies too, read
from the same arrays for all rows at once: eos, a stop id, its max_new_tokens, the context, its deadline), so that
sequence is answered at once; stop strings are only seen on the loop, so a row they end may compute a few tokens
the engine then drops. `Run.stop` (set by the engine when a request arrives or leaves, a cancelled one included)
ends the run after the step in progress.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .beam_scores import LogSoftmaxTopK
from .encoder_step import EncodeRow
from .runner import Runner
from .sampling import Choice, score_tokens
from .scheduler import Chunk, Plan, Scheduler, SeqState, Status
from .slot_runner import DecodeRow, PrefillRow
from .slot_state import SlotState
from .strategies import Planned, Settle, StepContext, StepRow, plan_rows


@dataclass(frozen=True)
class Run:
    """Decode steps back to back after a pure decode plan's first (the engine decides when: loop.EngineLoop._run)."""

    steps: int                     # at most this many steps in all ...
    budget_s: float                # ... and none that would take the run past this many seconds
    stop: threading.Event          # set: no further step after the one in progress
    rows: SlotState                # a row whose token ends its sequence ends the run (read, not written, here)


@dataclass(frozen=True)
class Work:
    """A plan in the runner's terms (built on the loop, run in the thread)."""

    plan: Plan
    decode_rows: list[DecodeRow]          # plan.decode's rows, then plan.tails' (one-token chunks)
    idle: dict[int, int]                  # slot -> where a decode run may write a throw-away token
    calls: list[list[PrefillRow]]         # one per plan.prefill call
    encode: list[EncodeRow] = field(default_factory=list)   # plan.encode's sources, with their slots
    run: Run | None = None                # more decode steps after the first (a pure decode plan only)
    # Set: the step after this one is computed while the loop applies it (SlotExecutor.ahead), its rows the ones
    # these arrays say go on, read before the loop sees this step's outcome.
    overlap: SlotState | None = None


@dataclass
class Written:
    """A prompt chunk now in its slot: the first generated token if it completed the prompt (and its strategy
    chose one), and the scores of the prompt tokens after each of its positions (requests with prompt_logprobs)."""

    chunk: Chunk
    first_token: Choice | None = None
    prompt_scores: list[Choice] = field(default_factory=list)


@dataclass
class Outcome:
    decoded: list[tuple[SeqState, Choice | None]] = field(default_factory=list)   # None: no token of its own
    written: list[Written] = field(default_factory=list)
    failed: list[tuple[list[SeqState], str, Exception]] = field(default_factory=list)
    settles: list[Settle] = field(default_factory=list)     # what the strategies leave for the loop
    # Decode steps after the first, run back to back (Work.run): each the rows that took it, with their token.
    more: list[list[tuple[SeqState, Choice]]] = field(default_factory=list)
    step_s: float = 0.0      # seconds the first step took in the thread (its calls and its strategies' choices)


@dataclass(frozen=True)
class Ahead:
    """The step after an iteration's, as `run` left it for `ahead`: each row that goes on with the token it was
    just given and where that token is written, and where the others may write a throw-away token."""

    rows: list[tuple[SeqState, int, int]]      # (state, token, position)
    idle: dict[int, int]


class SlotExecutor:
    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self._top: LogSoftmaxTopK | None = None       # the strategies' top log-probs, made at first use
        self.context = StepContext(self.top)
        self._ahead: Ahead | None = None       # written by `run`, taken by the `ahead` call after it (one thread)

    def top(self, logits: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        if self._top is None:
            self._top = LogSoftmaxTopK(self.runner.session)
        return self._top(logits, n)

    @staticmethod
    def prepare(plan: Plan, scheduler: Scheduler, run: Run | None = None, overlap: SlotState | None = None) -> Work:
        # One-token prompt chunks ride the decode call: a row at the slot's next position, like a decode row.
        decode_rows = [DecodeRow(s.slot, s.owner.generated[-1], s.computed) for s in plan.decode] + \
                      [DecodeRow(c.seq.slot, c.seq.owner.prompt_ids[c.start], c.start) for c in plan.tails]
        # Where a decode run may write a throw-away token for a slot that is not decoding: the slot's next
        # position after this iteration's chunk (overwritten by its next chunk or first decode, read by no one),
        # or just past the prefix a free slot keeps for reuse.
        idle = scheduler.free_write_positions()
        idle.update({s.slot: s.computed for s in scheduler.running if s.status is Status.PREFILLING})
        for call in plan.prefill:
            for c in call.chunks:
                idle[c.seq.slot] = c.start + c.length
        calls = [[PrefillRow(c.seq.slot, c.seq.owner.prompt_ids[c.start:c.start + c.length], c.start)
                  for c in call.chunks] for call in plan.prefill]
        return Work(plan, decode_rows, idle, calls, [_encode_row(s) for s in plan.encode], run, overlap)

    def run(self, work: Work) -> Outcome:
        """Worker thread. A failing call fails only its own sequences (in `Outcome.failed`)."""
        plan, out = work.plan, Outcome()
        started = time.perf_counter()
        unencoded = self._encode(work, out)
        decoded, prefilled = self._calls(work)
        rows: list[StepRow] = []         # every row that gets a next token this step, for its strategy
        chunks: list[tuple[Chunk, np.ndarray]] = []
        if isinstance(decoded, Exception):
            out.failed.append(([*plan.decode, *(c.seq for c in plan.tails)], "decode step failed", decoded))
        else:
            rows += [StepRow(s, decoded, i, s.computed + 1) for i, s in enumerate(plan.decode)
                     if _wants_token(s) and s not in unencoded]
            n = len(plan.decode)
            chunks += [(c, decoded[n + j:n + j + 1]) for j, c in enumerate(plan.tails)]
        for call, logits in zip(plan.prefill, prefilled):
            if isinstance(logits, Exception):
                out.failed.append(([c.seq for c in call.chunks], "prefill failed", logits))
            else:
                chunks += zip(call.chunks, logits)
        out.written = [Written(chunk) for chunk, _ in chunks]
        # The first token of every sequence whose prompt is now in: the logits of its chunk's last position.
        rows += [StepRow(c.seq, logits, c.length - 1, c.start + c.length) for c, logits in chunks
                 if c.completes_prompt and _wants_token(c.seq) and c.seq not in unencoded]
        planned = self._plan(rows, out)
        choices = {id(state): choice for state, choice in planned.choices}
        out.decoded = [(s, choices.get(id(s))) for s in plan.decode] if not isinstance(decoded, Exception) else []
        for w, (chunk, logits) in zip(out.written, chunks):
            w.first_token = choices.get(id(chunk.seq)) if chunk.completes_prompt else None
            w.prompt_scores = _prompt_scores(chunk, logits)
        out.step_s = time.perf_counter() - started
        # Last: the more steps' decodes write over `decoded` (runner.decode's buffer). A run is planned only
        # without prompts and for strategies that run ahead (loop.EngineLoop._run): nothing read above is read after.
        if work.run is not None and not isinstance(decoded, Exception):
            self._more_steps(work.run, work.idle, out, started)
        self._ahead = _next_step(work, out) if work.overlap is not None and not isinstance(decoded, Exception) \
            else None
        return out

    def ahead(self, work: Work) -> Outcome:
        """Worker thread, the call after `run(work)` (the loop hands both over at once, so this one starts as soon
        as that one ends): one more decode step of the rows `run` left going on, each fed the token it was just
        given, while the loop applies that outcome. Its tokens come back as `Outcome.more`'s one step; the loop
        takes them after the first step's. Reads nothing the loop changes meanwhile: the rows, their tokens and
        positions were fixed by `run`; the strategies' samplers are this thread's."""
        ahead, self._ahead = self._ahead, None
        out = Outcome()
        if ahead is not None and ahead.rows:
            self._decode_step(ahead.rows, ahead.idle, out)
        return out

    def _decode_step(self, rows: list[tuple[SeqState, int, int]], idle: dict[int, int], out: Outcome
                     ) -> list[tuple[SeqState, Choice]] | None:
        """One decode step of `rows` ((state, input token, its position)), after an iteration's first (a run's or
        the overlapped one): the strategies' choices, also appended to `out.more`; None when the call failed (its
        rows then in `out.failed`, as a row its strategy failed is)."""
        try:
            logits = self.runner.decode([DecodeRow(s.slot, token, position) for s, token, position in rows], idle)
        except Exception as exc:    # onnxruntime's own exception types
            out.failed.append(([s for s, _, _ in rows], "decode step failed", exc))
            return None
        planned = plan_rows([StepRow(s, logits, i, position + 1) for i, (s, _, position) in enumerate(rows)],
                            self.context)
        out.failed += planned.failed
        out.more.append(planned.choices)
        return planned.choices

    def _plan(self, rows: list[StepRow], out: Outcome) -> Planned:
        """The rows' strategies choose; their slot copies are made, all at once (a failed copy fails the
        sequences whose strategy asked for it); what they leave for the loop goes in `out.settles`."""
        planned = plan_rows(rows, self.context)
        out.failed += planned.failed
        copies = [c for _, cs in planned.copies for c in cs]
        try:
            if copies:
                self.runner.copy_prefixes(copies)
        except Exception as exc:    # onnxruntime's own exception types
            asked = {id(s) for states, cs in planned.copies if cs for s in states}
            out.failed += [(states, "slot copy failed", exc) for states, cs in planned.copies if cs]
            planned.choices = [(s, c) for s, c in planned.choices if id(s) not in asked]
            planned.settles = [s for s in planned.settles if not any(id(x) in asked for x in s.states)]
        out.settles += planned.settles
        return planned

    def _more_steps(self, run: Run, idle: dict[int, int], out: Outcome, started: float) -> None:
        """Steps 2..run.steps of a pure decode plan, each row fed the token it was just given. The run ends
        as soon as any row would leave it, so a finished sequence is answered and its slot freed at once (and
        no row's slot is ever left out of a decode call it sits under), and before a step that would take it
        past run.budget_s (judged by the step before), so its tokens reach the streams at that pace at least."""
        live = [(s, c) for s, c in out.decoded if c is not None]
        if len(live) != len(out.decoded):
            return
        last = time.perf_counter()
        previous = last - started
        states = [s for s, _ in live]
        slots = np.fromiter((s.slot for s in states), np.intp, len(states))
        for step in range(1, run.steps):
            # The loop has taken none of this run's tokens yet: the tokens checked are each row's step-th untaken.
            if run.stop.is_set() or last - started + previous > run.budget_s or \
                    run.rows.ends(slots, np.fromiter((c.token_id for _, c in live), np.int64, len(live)),
                                  step - 1, time.monotonic()).any():
                return
            chosen = self._decode_step([(s, c.token_id, s.computed + step) for s, c in live], idle, out)
            if chosen is None:
                return
            live = chosen
            if len(live) != len(states):    # a row got no token: `slots` no longer lines up with the rows
                return
            now = time.perf_counter()
            last, previous = now, now - last

    def _encode(self, work: Work, out: Outcome) -> set[SeqState]:
        """The encoder step (before any decoder call reads the cross buffers); the states it failed."""
        if not work.encode:
            return set()
        try:
            self.runner.encode(work.encode)
        except Exception as exc:    # onnxruntime's own exception types
            states = [s for state in work.plan.encode for s in state.owner.source_states]
            out.failed.append((states, "encoder step failed", exc))
            return set(states)
        return set()

    def _calls(self, work: Work) -> tuple[np.ndarray | Exception, list[np.ndarray | Exception]]:
        runner, plan, calls = self.runner, work.plan, work.calls
        decoded: np.ndarray | Exception = np.empty((0, 0), np.float32)
        prefilled: list[np.ndarray | Exception] = []
        for copy in plan.copies:      # before any call: a source slot may be written later this iteration
            runner.copy_prefix(copy.source, copy.target, copy.length)
        prefill_plan = plan.prefill
        if work.decode_rows and calls and runner.mixed_session is not None:
            # Decode and the first prompt chunk in one run: the weights are read once for both.
            try:
                decoded, first = runner.decode_and_prefill(work.decode_rows, work.idle, calls[0],
                                                           prefill_plan[0].first_prompt)
                prefilled.append(first)
            except Exception as exc:   # onnxruntime reports graph errors as RuntimeError and friends
                decoded = exc
                prefilled.append(exc)
            calls, prefill_plan = calls[1:], prefill_plan[1:]
        elif work.decode_rows:
            try:
                decoded = runner.decode(work.decode_rows, work.idle)
            except Exception as exc:
                decoded = exc
        for rows, call in zip(calls, prefill_plan):
            try:
                prefilled.append(runner.prefill(rows, call.first_prompt))
            except Exception as exc:
                prefilled.append(exc)
        return decoded, prefilled


def _next_step(work: Work, out: Outcome) -> Ahead:
    """What `ahead` runs after this step: every row that got a token this step (a decode row, a completed prompt)
    and that the token does not end (slot_state.SlotState.ends, read now: the loop has not taken the token yet).
    A row that ends, or got no token, writes its throw-away token at the slot's next position, past everything the
    slot holds (and past the prefix a freed slot keeps for reuse), as an idle slot does."""
    assert work.overlap is not None
    idle = dict(work.idle)
    given: list[tuple[SeqState, Choice | None, int]] = [(s, c, s.computed + 1) for s, c in out.decoded]
    given += [(w.chunk.seq, w.first_token, w.chunk.start + w.chunk.length) for w in out.written
              if w.chunk.completes_prompt]
    rows = [(s, c, p) for s, c, p in given if c is not None]
    for s, c, position in given:
        if c is None:
            idle[s.slot] = position
    if rows:
        ends = work.overlap.ends(np.fromiter((s.slot for s, _, _ in rows), np.intp, len(rows)),
                               np.fromiter((c.token_id for _, c, _ in rows), np.int64, len(rows)), 0,
                               time.monotonic())
        for (s, _, position), end in zip(rows, ends):
            if end:
                idle[s.slot] = position
        rows = [row for row, end in zip(rows, ends) if not end]
    return Ahead([(s, c.token_id, p) for s, c, p in rows], idle)


def _encode_row(state: SeqState) -> EncodeRow:
    """A state admitted with a source: its ids, and the slots that decode from them (a beam search's every beam)."""
    owner = state.owner
    return EncodeRow(owner.source_ids or [], tuple(s.slot for s in owner.source_states))


def _wants_token(state: SeqState) -> bool:
    seq = state.owner
    return not (seq.cancelled or seq.done)


def _prompt_scores(chunk: Chunk, rows: np.ndarray) -> list[Choice]:
    """Scores of the prompt tokens after each position of the chunk, for a request that asked (prompt_logprobs):
    a log-softmax over every position's logits, work for this thread, not the event loop (bench/FINDINGS.md)."""
    seq = chunk.seq.owner
    n = min(chunk.length, len(seq.prompt_ids) - 1 - chunk.start)   # the last prompt token scores nothing
    if seq.prompt_tokens is None or not _wants_token(chunk.seq) or n <= 0:
        return []
    ids = np.asarray(seq.prompt_ids[chunk.start + 1:chunk.start + 1 + n])
    return score_tokens(rows[:n], ids, seq.params.prompt_logprobs or 0)
