"""The engine's core loop: plan -> executor -> apply the outcome, on the event loop, with one worker thread.

Each iteration the scheduler (scheduler.py, pure Python) plans which slots decode a token and which prompt chunks
go in; the executor (executor.py) runs the plan in the engine's one worker thread — the onnxruntime calls over the
slot cache on the session's device (slot_runner.py, device_cache.py), then the next token of every row that gets
one, all rows together (sampling.py); the outcome comes back to the loop, where a step's tokens are applied to the
running rows' array state and checked against the stop tokens and budgets at once (slot_state.py, written when the
plan hands a sequence its slot, cleared when it leaves), and then each token becomes text and a chunk on its
request's queue (outputs.py). The loop is free while the thread computes: consumers take their chunks (and the
doors send them) meanwhile.

While nothing waits to be admitted and every running sequence decodes, one iteration may run several decode steps
back to back in the thread (GenerationConfig.decode_steps, within decode_run_ms; executor.py): an arrival or a
leaving consumer sets `interrupt` (`kick`), which ends such a run after its current step. When it cannot (requests
arrive, prompts go in) and steps are short (overlap_step_ms), the loop hands the thread the iteration's step and the
one after it at once: the thread computes the second from the tokens it just chose while the loop applies the first
(`_overlaps`, executor.SlotExecutor.ahead), so the loop's work per step runs beside onnxruntime's instead of
between its calls.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time

from .engine_metrics import EngineMetrics
from .executor import Outcome, Run, SlotExecutor
from .factory import EngineParts
from .outputs import take_steps, take_tokens
from .params import GenerationConfig
from .results import FINISH_CANCELLED, EngineStoppedError
from .sampling import Choice
from .scheduler import Plan, Scheduler, SeqState, Status
from .sequence import Sequence, to_generated_token
from .slot_state import SlotState, deadline_passed
from .worker_thread import WorkerThread

logger = logging.getLogger(__name__)


class EngineLoop:
    """The asyncio task that runs the iterations and the worker thread they compute in."""

    def __init__(self, scheduler: Scheduler, parts: EngineParts, config: GenerationConfig, metrics: EngineMetrics,
                 label: str, instance: int) -> None:
        """instance: which of a model's engines this is (--generation-instances): its worker thread's name."""
        self._scheduler, self._config, self._metrics = scheduler, config, metrics
        self._runner, self._spec, self._tokenizer = parts.runner, parts.spec, parts.tokenizer
        self._executor = SlotExecutor(parts.runner)
        # The running rows' state by slot (slot_state.py): written when the scheduler hands out a slot.
        self._slots = SlotState(scheduler.config.num_slots, parts.spec.eos_id, parts.spec.max_length)
        self._label = label
        self._thread_name = f"generate-{label}" + (f"-{instance}" if instance else "")
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._thread: WorkerThread | None = None
        self._event_loop: asyncio.AbstractEventLoop | None = None
        # Set when a request arrives or leaves: a run of several decode steps (decode_steps) stops after its step.
        self.interrupt = threading.Event()
        self._step_s = float("inf")     # how long the last iteration's first step took (overlap_step_ms)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._event_loop = asyncio.get_running_loop()
        self._thread = WorkerThread(self._thread_name)
        self._task = asyncio.create_task(self._loop(), name=f"generation-loop-{self._label}")

    async def stop(self) -> None:
        """Stop the loop; every waiting or running request ends with finish_reason "cancelled"."""
        task, self._task = self._task, None
        self.interrupt.set()     # a run of several decode steps ends after the one in progress
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        for seq in self._sequences():
            seq.finish(FINISH_CANCELLED)
        self._clear()
        if self._thread is not None:
            # A step still running in the thread finishes on its own; do not block the event loop on it.
            self._thread.stop()
            self._thread = None

    def kick(self) -> None:
        """A request arrived or left: end a run of decode steps after its step, and wake the loop if idle."""
        self.interrupt.set()
        if self._wake is not None:
            self._wake.set()

    async def _loop(self) -> None:
        if self._wake is None:
            raise RuntimeError("generation loop started without start()")
        while True:
            ran = firsts = False
            try:
                self._retire()
                if not (self._scheduler.waiting or self._scheduler.running):
                    self._metrics.record_gauges()  # the last retire must show up before idling
                    self._runner.idle()     # nothing runs now: the runner may tidy its buffers
                    self._wake.clear()
                    await self._wake.wait()
                    await self._settle_arrivals()
                    continue
                ran, firsts = await self._iterate()
            except asyncio.CancelledError:
                raise
            except Exception as exc:   # a bug here must not leave consumers waiting forever
                logger.exception("generation loop of %s failed; failing its requests", self._label)
                for seq in self._sequences():
                    seq.fail(RuntimeError(f"generation failed: {exc}"))
                self._clear()
            self._metrics.record_gauges()
            # No yield between steps: consumers take their chunks (and the doors send them) while the NEXT step
            # computes, since the loop is free while it awaits the worker thread. Only an iteration that ran
            # nothing yields here, so the loop never spins without letting others run; and one that gave some
            # sequence its first token, so the doors send it before the next run's threads take the cores
            # (bench/FINDINGS.md).
            if not ran or firsts:
                await asyncio.sleep(0)

    async def _iterate(self) -> tuple[bool, bool]:
        """One iteration: plan, run the plan in the worker thread (with the step after it when `_overlaps`), apply
        the outcome (then the overlapped step's). Whether it ran, and whether a prompt was completed (a sequence got
        its first token)."""
        plan = self._scheduler.plan()
        if plan.empty:
            return False, False
        self._slots.admit_plan(plan)
        self.interrupt.clear()
        run = self._run(plan)
        work = self._executor.prepare(plan, self._scheduler, run,
                                      self._slots if run is None and self._overlaps(plan) else None)
        if self._thread is None or self._event_loop is None:
            raise EngineStoppedError(f"generation engine {self._label} is not running")
        outcome = self._thread.submit(self._event_loop, self._executor.run, work)
        # The step after this one, handed over now: the thread starts it the moment this one ends, and computes it
        # while the loop applies this one's outcome below.
        ahead = self._thread.submit(self._event_loop, self._executor.ahead, work) if work.overlap is not None else None
        try:
            first = await outcome
        except BaseException:
            if ahead is not None:
                ahead.cancel()
            raise
        self._step_s = first.step_s
        self._apply(first)
        steps = 1 + len(first.more)
        if ahead is not None:
            # An outcome of later steps alone (`more`, no first step): _apply takes them after the first's tokens,
            # each after the scheduler records the token its call read, passing over rows ended meanwhile.
            more = await ahead
            self._apply(more)
            for step in more.more:
                self._metrics.record_overlapped(len(step))
        self._retire()     # a sequence that just finished gives its slot back before anyone looks
        self._metrics.record_plan(plan, steps)
        return True, any(w.chunk.completes_prompt for w in first.written)

    def _overlaps(self, plan: Plan) -> bool:
        """Whether the step after this plan's is computed while the loop applies this one (GenerationConfig.
        overlap_step_ms): when the last iteration's step was short, decode_steps allows two steps an iteration,
        every running row decodes once this plan's chunks are in (a long prompt goes in a chunk an iteration, beside
        one decode step each: the overlap would double the steps it waits for), and its strategy runs ahead (a beam
        search's next rows depend on what the loop settles)."""
        cfg = self._config
        if self._step_s * 1000 >= cfg.overlap_step_ms or cfg.decode_steps == 1 or \
                not (plan.decode or plan.tails or plan.prefill):
            return False
        completing = {id(c.seq) for c in plan.tails} | \
            {id(c.seq) for call in plan.prefill for c in call.chunks if c.completes_prompt}
        return all((s.status is Status.DECODING or id(s) in completing) and s.owner.strategy.runs_ahead
                   for s in self._scheduler.running)

    def _run(self, plan: Plan) -> Run | None:
        """More decode steps back to back after this iteration's first: for a plan of decode rows alone while no
        request waits, no prompt is part-way in (they would wait the whole run) and every running row's strategy
        runs ahead (a beam search does not: its step may copy slots the next decode reads)."""
        cfg = self._config
        if cfg.decode_steps == 1 or plan.prefill or plan.tails or plan.encode or plan.copies or self._scheduler.waiting:
            return None
        if any(s.status is not Status.DECODING or not s.owner.strategy.runs_ahead for s in self._scheduler.running):
            return None
        return Run(cfg.decode_steps, cfg.decode_run_ms / 1000, self.interrupt, self._slots)

    def _apply(self, outcome: Outcome) -> None:
        self._metrics.tokens_arrive()
        try:
            self._apply_outcome(outcome)
        finally:
            self._metrics.record_tokens()

    def _fail(self, failed: list[tuple[list[SeqState], str, Exception]]) -> None:
        """Sequences whose call failed end with the error; their slots' contents are not kept for reuse."""
        for states, what, exc in failed:
            logger.error("%s on %s for %d sequences: %s", what, self._label, len(states), exc)
            for state in states:
                state.owner.fail(RuntimeError(f"{what}: {exc}"))      # a sequence already done stays as it is
                self._finish(state, reusable=False)

    def _apply_outcome(self, outcome: Outcome) -> None:
        self._fail(outcome.failed)
        decoded = self._scheduler.decoded

        def consumed(step: list[tuple[SeqState, Choice | None]]) -> None:
            for state, _ in step:        # the token each row's call read: the one generated before it
                decoded(state, state.owner.generated[-1])
        consumed(outcome.decoded)
        # A run's steps at once; a row a stop string ends meanwhile is passed over, its later tokens dropped.
        take_steps([outcome.decoded, *outcome.more], self._slots, self._tokenizer, self._metrics.token, consumed)
        firsts: list[tuple[SeqState, Choice | None]] = []
        for w in outcome.written:
            self._scheduler.prefilled(w.chunk)
            seq = w.chunk.seq.owner
            if seq.cancelled or seq.done:
                continue
            if seq.prompt_tokens is not None:
                seq.prompt_tokens.extend(to_generated_token(c, self._tokenizer) for c in w.prompt_scores)
            if w.chunk.completes_prompt:      # the prompt is in: its last position's logits gave the first token
                self._slots.ensure(w.chunk.seq)
                firsts.append((w.chunk.seq, w.first_token))
        self._take(firsts)
        for settle in outcome.settles:
            settle.settle(self._scheduler, self._metrics.token)

    def _take(self, rows: list[tuple[SeqState, Choice | None]]) -> None:
        take_tokens(rows, self._slots, self._tokenizer, self._metrics.token)

    def _finish(self, state: SeqState, reusable: bool = True) -> None:
        """The sequence leaves its slot: the slot's array row is cleared with it."""
        if state.slot is not None:
            self._slots.free(state.slot)
        self._scheduler.finish(state, reusable)

    def _retire(self) -> None:
        """Drop sequences that are done, cancelled, or past their deadline; their slots are free again."""
        now = time.monotonic()
        for state in list(self._scheduler.waiting):
            seq = state.owner
            if seq.cancelled or seq.done:
                self._scheduler.finish(state)
            elif deadline_passed(seq, now):
                self._scheduler.finish(state)
                seq.fail(TimeoutError("deadline passed while waiting; nothing was generated"))
        for state in list(self._scheduler.running):
            seq = state.owner
            if seq.cancelled and not seq.done:
                seq.finish_reason = FINISH_CANCELLED    # nobody listens: no chunk
            elif deadline_passed(seq, now):
                seq.finish(FINISH_CANCELLED)
            if seq.done:
                self._finish(state)

    async def _settle_arrivals(self) -> None:
        """Woken from idle: requests sent in the same instant reach the engine a little apart (each is parsed and
        tokenized on this loop first). Wait while they keep coming, until none came for arrival_quiet_ms or
        arrival_window_ms passed, so they are prefilled together instead of the first alone and the rest one by
        one beside it. The quiet time is read from the clock, not counted in sleeps: a loop's timer can fire
        early."""
        last = time.monotonic()
        end = last + self._config.arrival_window_ms / 1000
        quiet = self._config.arrival_quiet_ms / 1000
        seen = len(self._scheduler.waiting)
        while True:
            await asyncio.sleep(0.001)
            now = time.monotonic()
            if len(self._scheduler.waiting) != seen:
                seen, last = len(self._scheduler.waiting), now
            if now - last >= quiet or now >= end:
                return

    def _sequences(self) -> list[Sequence]:
        """Every waiting or running request."""
        return [s.owner for s in (*self._scheduler.waiting, *self._scheduler.running)]

    def _clear(self) -> None:
        for state in (*self._scheduler.waiting, *self._scheduler.running):
            self._finish(state)

