"""The executor: runs one iteration's plan (scheduler.py) in the engine's worker thread.

`prepare` (on the event loop, where the scheduler's state lives) turns the plan into runner rows; `run` (in the
worker thread: onnxruntime and numpy release the GIL, the loop keeps serving) makes the calls over the slot
cache — prefix copies first, then the encoder step of sources admitted this iteration (encoder-decoder packages:
encoder_step.py), then the decode call (with the iteration's first prompt chunk in the same run when
the package has a mixed graph), then the other prefill calls, in this order (slot_runner.py says why) — and
then the work on their logits: the next token of every sequence that gets one this step, all rows at once
(sampling.choose_rows), the step of every beam search whose beams decoded (beams.py; the slot copies of all
of them made together after the last), and the scores of prompt tokens for requests that asked. What comes back
is a typed outcome; the engine applies it on the loop.

A pure decode plan may come with a `Run` (GenerationConfig.decode_steps, decode_run_ms): the thread then feeds each
row's chosen token straight back as its next decode row, up to `steps` times and within `budget_s` (a short step
runs many times, a long one once), without returning to the loop.
The run ends before any row's token would end its sequence (eos, a stop id, its max_new_tokens, the context, its
deadline), so that sequence is answered at once; stop strings are only seen on the loop, so a row they end may
compute a few tokens the engine then drops. `Run.stop` (set by the engine when a request arrives or leaves) ends
the run after the step in progress.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .beam_scores import LogSoftmaxTopK
from .beams import Beam, BeamSearch
from .encoder_step import EncodeRow
from .sampling import Choice, choose_rows, score_tokens
from .scheduler import Chunk, Copy, Plan, Scheduler, SeqState, Status
from .slot_runner import DecodeRow, PrefillRow, SlotRunner


# Rows per call of the beam scores' graph (beam_scores.py): its seven passes over 4 rows of 58,101 logits (0.9 MB)
# stay in a core's cache, over 64 rows (15 MB) they do not; 4 rows a call was the fastest tried (bench/FINDINGS.md).
BEAM_ROWS = 4


@dataclass(frozen=True)
class Run:
    """Decode steps back to back after a pure decode plan's first (the engine decides when: loop.EngineLoop._run)."""

    steps: int                     # at most this many steps in all ...
    budget_s: float                # ... and none that would take the run past this many seconds
    stop: threading.Event          # set: no further step after the one in progress
    eos_id: int | None             # a row choosing it ends the run (unless its request ignores eos)
    max_length: int                # the slots' context: no step writes past it


@dataclass(frozen=True)
class Work:
    """A plan in the runner's terms (built on the loop, run in the thread)."""

    plan: Plan
    decode_rows: list[DecodeRow]          # plan.decode's rows, then plan.tails' (one-token chunks)
    idle: dict[int, int]                  # slot -> where a decode run may write a throw-away token
    calls: list[list[PrefillRow]]         # one per plan.prefill call
    encode: list[EncodeRow] = field(default_factory=list)   # plan.encode's sources, with their slots
    run: Run | None = None                # more decode steps after the first (a pure decode plan only)


@dataclass
class Written:
    """A prompt chunk now in its slot: the first generated token if it completed the prompt, and the scores of
    the prompt tokens after each of its positions (requests with prompt_logprobs)."""

    chunk: Chunk
    first_token: Choice | None = None
    prompt_scores: list[Choice] = field(default_factory=list)


@dataclass
class Outcome:
    decoded: list[tuple[SeqState, Choice | None]] = field(default_factory=list)   # None: cancelled meanwhile
    written: list[Written] = field(default_factory=list)
    failed: list[tuple[list[SeqState], str, Exception]] = field(default_factory=list)
    beams: list[BeamSearch] = field(default_factory=list)    # searches that took a step
    # Decode steps after the first, run back to back (Work.run): each the rows that took it, with their token.
    more: list[list[tuple[SeqState, Choice]]] = field(default_factory=list)


class SlotExecutor:
    def __init__(self, runner: SlotRunner) -> None:
        self.runner = runner
        self._top: LogSoftmaxTopK | None = None       # a beam step's top log-probs, made at the first search

    @property
    def top(self) -> LogSoftmaxTopK:
        if self._top is None:
            self._top = LogSoftmaxTopK(self.runner.session)
        return self._top

    @staticmethod
    def prepare(plan: Plan, scheduler: Scheduler, run: Run | None = None) -> Work:
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
        return Work(plan, decode_rows, idle, calls, [_encode_row(s) for s in plan.encode], run)

    def run(self, work: Work) -> Outcome:
        """Worker thread. A failing call fails only its own sequences (in `Outcome.failed`)."""
        plan, out = work.plan, Outcome()
        started = time.perf_counter()
        unencoded = self._encode(work, out)
        decoded, prefilled = self._calls(work)
        tail_logits: list[tuple[Chunk, np.ndarray]] = []
        searches: dict[BeamSearch, dict[int, int]] = {}     # a search's beam index -> its row of `decoded`
        scored: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        if isinstance(decoded, Exception):
            out.failed.append(([*plan.decode, *(c.seq for c in plan.tails)], "decode step failed", decoded))
        else:
            n = len(plan.decode)
            live = [i for i, s in enumerate(plan.decode) if _wants_token(s) and not isinstance(s.owner, Beam)]
            rows = decoded[:n] if len(live) == n else decoded[live]     # every row live: no copy of the logits
            choices = dict(zip(live, choose_rows([plan.decode[i].owner.sampler for i in live], rows)))
            out.decoded = [(s, choices.get(i)) for i, s in enumerate(plan.decode)]
            tail_logits = list(zip(plan.tails, decoded[n:, None, :]))
            for position, state in enumerate([*plan.decode, *(c.seq for c in plan.tails)]):
                if isinstance(state.owner, Beam) and _wants_token(state) and state not in unencoded:
                    searches.setdefault(state.owner.search, {})[state.owner.index] = position
            try:
                scored = self._beam_scores(decoded, searches)
            except Exception as exc:   # onnxruntime's own exception types: those searches fail, nothing else
                for search in searches:
                    out.failed.append((search.states, "beam search step failed", exc))
                searches = {}
            # Last: the more steps' decodes write over `decoded` (runner.decode's buffer). A run is planned only
            # without tails and beams (loop.EngineLoop._run), so nothing taken from it above is read after them.
            if work.run is not None:
                self._more_steps(work.run, work.idle, out, started)
        chunks: list[tuple[Chunk, np.ndarray]] = tail_logits
        for call, logits in zip(plan.prefill, prefilled):
            if isinstance(logits, Exception):
                out.failed.append(([c.seq for c in call.chunks], "prefill failed", logits))
            else:
                chunks += zip(call.chunks, logits)
        out.written = [Written(chunk) for chunk, _ in chunks]
        # The first token of every sequence whose prompt is now in: one batch over the last positions' logits.
        firsts = [(w, rows[w.chunk.length - 1]) for w, (_, rows) in zip(out.written, chunks)
                  if w.chunk.completes_prompt and _wants_token(w.chunk.seq) and w.chunk.seq not in unencoded
                  and not isinstance(w.chunk.seq.owner, Beam)]
        if firsts:
            picked = choose_rows([w.chunk.seq.owner.sampler for w, _ in firsts], np.stack([r for _, r in firsts]))
            for (w, _), choice in zip(firsts, picked):
                w.first_token = choice
        for w, (_, rows) in zip(out.written, chunks):
            w.prompt_scores = _prompt_scores(w.chunk, rows)
        copies: list[tuple[BeamSearch, list[Copy]]] = []
        for search, positions in searches.items():
            self._beam_step(search, {b: decoded[p] for b, p in positions.items()},
                            {b: scored[p] for b, p in positions.items()}, out, copies)
        self._copy_beams(copies, out)
        return out

    def _beam_scores(self, decoded: np.ndarray, searches: dict[BeamSearch, dict[int, int]]
                     ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Every search's rows (positions in `decoded`) scored at once: each row's 2k best log-probabilities and
        ids for the widest search's k, in calls of at most BEAM_ROWS rows over slices of the logits (no copy
        when the rows are consecutive, as a batch of beam searches' are), rather than stacking each search's rows
        for a call of its own (bench/FINDINGS.md)."""
        if not searches:
            return {}
        vocab = next(iter(searches)).vocab_size
        keep = 2 * max(s.options.num_beams for s in searches)
        order = sorted(p for positions in searches.values() for p in positions.values())
        scored: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for lo in range(0, len(order), BEAM_ROWS):
            part = order[lo:lo + BEAM_ROWS]
            consecutive = part[-1] - part[0] == len(part) - 1
            block = decoded[part[0]:part[-1] + 1, :vocab] if consecutive else decoded[part, :vocab]
            values, ids = self.top(block, keep)
            scored.update((p, (values[i], ids[i])) for i, p in enumerate(part))
        return scored

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
        for step in range(1, run.steps):
            if run.stop.is_set() or last - started + previous > run.budget_s \
                    or not all(_goes_on(s, c, step, run) for s, c in live):
                return
            rows = [DecodeRow(s.slot, c.token_id, s.computed + step) for s, c in live]
            try:
                logits = self.runner.decode(rows, idle)
            except Exception as exc:    # onnxruntime's own exception types
                out.failed.append(([s for s, _ in live], "decode step failed", exc))
                return
            live = list(zip([s for s, _ in live], choose_rows([s.owner.sampler for s, _ in live], logits)))
            out.more.append(live)
            now = time.perf_counter()
            last, previous = now, now - last

    def _encode(self, work: Work, out: Outcome) -> set[SeqState]:
        """The encoder step (before any decoder call reads the cross buffers); the states it failed."""
        if not work.encode:
            return set()
        try:
            self.runner.encode(work.encode)   # type: ignore[attr-defined]   (a CrossSlotRunner: plan.encode)
        except Exception as exc:    # onnxruntime's own exception types
            states = [s for state in work.plan.encode for s in _slot_mates(state)]
            out.failed.append((states, "encoder step failed", exc))
            return set(states)
        return set()

    def _beam_step(self, search: BeamSearch, rows: dict[int, np.ndarray],
                   scored: dict[int, tuple[np.ndarray, np.ndarray]], out: Outcome,
                   copies: list[tuple[BeamSearch, list[Copy]]]) -> None:
        """One step of a search; the copies that put each kept hypothesis's rows in its beam's slot go in `copies`
        (made for every search at once by _copy_beams: searches never share a slot)."""
        try:
            written = search.beams[0].state.computed + 1      # type: ignore[union-attr]
            copies.append((search, search.step(rows, written, self.top, scored)))
        except Exception as exc:
            out.failed.append((search.states, "beam search step failed", exc))

    def _copy_beams(self, copies: list[tuple[BeamSearch, list[Copy]]], out: Outcome) -> None:
        """The searches' slot copies, then the searches are done with this step; a failed copy fails them all."""
        try:
            self.runner.copy_prefixes([c for _, cs in copies for c in cs])
        except Exception as exc:
            for search, _ in copies:
                out.failed.append((search.states, "beam search step failed", exc))
            return
        out.beams.extend(search for search, _ in copies)

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


def _encode_row(state: SeqState) -> EncodeRow:
    """A state admitted with a source: its ids, and the slots that decode from them (a beam search's every beam)."""
    owner = state.owner
    if isinstance(owner, Beam):
        return EncodeRow(owner.search.requests[0].source_ids or [], tuple(b.slot for b in owner.search.beams))
    return EncodeRow(owner.source_ids or [], (state.slot,))   # type: ignore[arg-type]


def _slot_mates(state: SeqState) -> list[SeqState]:
    """The states that read a state's source: its own, or every beam of its search."""
    return state.owner.search.states if isinstance(state.owner, Beam) else [state]


def _goes_on(state: SeqState, choice: Choice, step: int, run: Run) -> bool:
    """Whether a row decodes again after `step` tokens of this run, the last of them `choice`."""
    seq = state.owner
    token, params = choice.token_id, seq.params
    return not (seq.cancelled or seq.done
                or (token == run.eos_id and not params.ignore_eos) or token in params.stop_token_ids
                or len(seq.generated) + step >= params.max_new_tokens
                or state.computed + step >= run.max_length
                or (seq.deadline is not None and time.monotonic() >= seq.deadline))


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
