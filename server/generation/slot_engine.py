"""Continuous batching over an in-place-cache decoder (model.json cache.layout "inplace").

Three parts, each with one job:
  - Scheduler (scheduler.py, pure Python): who decodes, which prompt chunks are prefilled, slot ownership;
  - SlotRunner (slot_runner.py): the cache buffers and the onnxruntime calls that write them in place;
  - this engine: turns the plan into runner calls (in its worker thread), then samples, streams and
    retires on the event loop.
Each iteration runs the decode call first and the prefill calls after it: a decode call's throw-away rows
write at positions a prefill of the same iteration then overwrites (slot_runner.py).
"""
from __future__ import annotations

import logging
import time
from typing import Iterable

import numpy as np

from .engine import GenerationEngine
from .results import FINISH_CANCELLED
from .sampling import Choice, score_tokens
from .scheduler import Chunk, Plan, Scheduler, SchedulerConfig, SeqState, Status
from .sequence import Sequence, to_generated_token
from .slot_runner import DecodeRow, PrefillRow, SlotRunner

logger = logging.getLogger(__name__)


class SlotEngine(GenerationEngine):
    gives_prompt_logprobs = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        cfg = self.config
        self._scheduler = Scheduler(SchedulerConfig(num_slots=cfg.max_batch_size,
                                                    chunk_tokens=cfg.prefill_chunk_tokens,
                                                    max_prefill_tokens=cfg.max_prefill_tokens,
                                                    prefix_reuse=cfg.prefix_caching,
                                                    slot_length=self.spec.max_length))
        self._runner = SlotRunner(self.session, self.spec, cfg.max_batch_size, self._mixed_session)
        logger.info("generation %s: %d cache slots of %d tokens (%.1f MiB of %s on %s), prefill chunk %d tokens, %s",
                    self._label, cfg.max_batch_size, self.spec.max_length, self._runner.cache_bytes / 2 ** 20,
                    np.dtype(self.spec.past_dtype).name, self._runner.device.kind, cfg.prefill_chunk_tokens,
                    "mixed graph (decode rows and a chunk in one run)" if self._mixed_session is not None
                    else "no mixed graph")

    # ------------------------------------------------------------------ bookkeeping

    @property
    def active_sequences(self) -> int:
        return len(self._scheduler.running)

    @property
    def waiting_requests(self) -> int:
        return len(self._scheduler.waiting)

    def _sequences(self) -> Iterable[Sequence]:
        return [s.owner for s in (*self._scheduler.waiting, *self._scheduler.running)]

    def _enqueue(self, seq: Sequence) -> None:
        # A request scoring its prompt needs the logits at every prompt position, so none may come from a copied
        # prefix: its state does not track tokens (no reuse for it, nothing remembered of its slot).
        if seq.params.prompt_logprobs is None:
            seq.state = SeqState.of(seq.prompt_ids, owner=seq)
        else:
            seq.state = SeqState(len(seq.prompt_ids), owner=seq)
        self._scheduler.add(seq.state)

    def _dequeue_waiting(self, seq: Sequence) -> bool:
        if seq.state is not None and seq.state.status is Status.WAITING:
            self._scheduler.finish(seq.state)
            return True
        return False

    def _has_work(self) -> bool:
        return bool(self._scheduler.waiting or self._scheduler.running)

    def _clear(self) -> None:
        for state in (*self._scheduler.waiting, *self._scheduler.running):
            self._scheduler.finish(state)

    def _retire(self) -> None:
        now = time.monotonic()
        for state in list(self._scheduler.waiting):
            seq = state.owner
            if seq.cancelled or seq.done:
                self._scheduler.finish(state)
            elif self._deadline_passed(seq, now):
                self._scheduler.finish(state)
                seq.fail(TimeoutError("deadline passed while waiting; nothing was generated"))
        for state in list(self._scheduler.running):
            seq = state.owner
            if seq.cancelled and not seq.done:
                seq.finish_reason = FINISH_CANCELLED    # nobody listens: no chunk
            elif self._deadline_passed(seq, now):
                seq.finish(FINISH_CANCELLED)
            if seq.done:
                self._scheduler.finish(state)           # the slot is free for the next admission

    # ------------------------------------------------------------------ one iteration

    async def _iterate(self) -> bool:
        plan = self._scheduler.plan()
        if plan.empty:
            return False
        # One-token prompt chunks ride the decode call: a row at the slot's next position, like a decode row.
        decode_rows = [DecodeRow(s.slot, s.owner.generated[-1], s.computed) for s in plan.decode] + \
                      [DecodeRow(c.seq.slot, c.seq.owner.prompt_ids[c.start], c.start) for c in plan.tails]
        # Where a decode run may write a throw-away token for a slot that is not decoding: the slot's next
        # position after this iteration's chunk (overwritten by its next chunk or first decode, read by no one),
        # or just past the prefix a free slot keeps for reuse.
        idle = self._scheduler.free_write_positions()
        idle.update({s.slot: s.computed for s in self._scheduler.running if s.status is Status.PREFILLING})
        for call in plan.prefill:
            for c in call.chunks:
                idle[c.seq.slot] = c.start + c.length
        calls = [[PrefillRow(c.seq.slot, c.seq.owner.prompt_ids[c.start:c.start + c.length], c.start)
                  for c in call.chunks] for call in plan.prefill]
        decoded, prefilled = await self._in_thread(self._execute, decode_rows, idle, calls, plan)
        # Every chunk with the logits at each of its positions (a tail: one position, its decode-call row).
        written: list[tuple[Chunk, np.ndarray]] = []
        if isinstance(decoded, Exception):
            self._fail([*plan.decode, *(c.seq for c in plan.tails)], "decode step failed", decoded)
        else:
            for state, row, logits in zip(plan.decode, decode_rows, decoded):
                self._scheduler.decoded(state, row.token)
                seq = state.owner
                if not seq.cancelled and not seq.done:
                    self._advance(seq, logits)
            written += zip(plan.tails, decoded[len(plan.decode):, None, :])
        for call, logits in zip(plan.prefill, prefilled):
            if isinstance(logits, Exception):
                self._fail([c.seq for c in call.chunks], "prefill failed", logits)
            else:
                written += zip(call.chunks, logits)
        scores = await self._score_prompts(written)
        for chunk, rows in written:
            self._scheduler.prefilled(chunk)
            seq = chunk.seq.owner
            if seq.cancelled or seq.done:
                continue
            if seq.prompt_tokens is not None:
                seq.prompt_tokens.extend(to_generated_token(c, self._tokenizer) for c in scores.get(id(chunk), ()))
            if chunk.completes_prompt:     # the prompt is in: its last position's logits give the first token
                self._advance(seq, rows[chunk.length - 1])
        self._retire()     # a sequence that just finished gives its slot back before anyone looks
        self._record_plan(plan)
        return True

    async def _score_prompts(self, written: list[tuple[Chunk, np.ndarray]]) -> dict[int, list[Choice]]:
        """id(chunk) -> the scores of the prompt tokens after each of its positions, for sequences that asked
        (prompt_logprobs). A log-softmax over every position's logits is work for the worker thread, not the
        event loop (1024 positions of a 32k vocabulary: 0.09 s, 0.2 s with 20 alternatives, measured here)."""
        jobs = []
        for chunk, rows in written:
            seq = chunk.seq.owner
            n = min(chunk.length, len(seq.prompt_ids) - 1 - chunk.start)   # the last prompt token scores nothing
            if seq.prompt_tokens is not None and not (seq.cancelled or seq.done) and n > 0:
                jobs.append((chunk, rows[:n], np.asarray(seq.prompt_ids[chunk.start + 1:chunk.start + 1 + n]),
                             seq.params.prompt_logprobs or 0))
        if not jobs:
            return {}
        scored = await self._in_thread(lambda: [score_tokens(rows, ids, top) for _, rows, ids, top in jobs])
        return {id(chunk): choices for (chunk, *_), choices in zip(jobs, scored)}

    def _execute(self, decode_rows: list[DecodeRow], idle: dict[int, int], calls: list[list[PrefillRow]],
                 plan: Plan) -> tuple[np.ndarray | Exception, list[np.ndarray | Exception]]:
        """Worker thread: the decode call, then every prefill call (this order: see the module docstring).

        A failing call fails only its own sequences: its exception is returned in its place."""
        decoded: np.ndarray | Exception = np.empty((0, 0), np.float32)
        prefilled: list[np.ndarray | Exception] = []
        for copy in plan.copies:      # before any call: a source slot may be written later this iteration
            self._runner.copy_prefix(copy.source, copy.target, copy.length)
        if decode_rows and calls and self._runner.mixed_session is not None:
            # Decode and the first prompt chunk in one run: the weights are read once for both.
            try:
                decoded, first = self._runner.decode_and_prefill(decode_rows, idle, calls[0], plan.prefill[0].first_prompt)
                prefilled.append(first)
            except Exception as exc:
                decoded = exc
                prefilled.append(exc)
            calls, plan = calls[1:], Plan(plan.decode, plan.prefill[1:])
        elif decode_rows:
            try:
                decoded = self._runner.decode(decode_rows, idle)
            except Exception as exc:   # onnxruntime reports graph errors as RuntimeError and friends
                decoded = exc
        for rows, call in zip(calls, plan.prefill):
            try:
                prefilled.append(self._runner.prefill(rows, call.first_prompt))
            except Exception as exc:
                prefilled.append(exc)
        return decoded, prefilled

    def _fail(self, states, what: str, exc: Exception) -> None:
        logger.error("%s on %s for %d sequences: %s", what, self._label, len(states), exc)
        for state in states:
            state.owner.fail(RuntimeError(f"{what}: {exc}"))
            self._scheduler.finish(state, reusable=False)

    # ------------------------------------------------------------------ warm-up

    def warmup(self) -> None:
        """Every kind of run serving will make, at full width (so onnxruntime sizes its buffers now, not during
        the first requests): a two-row first prompt, a continuation chunk, a decode step over every slot with
        a hole, and the mixed graph's decode + chunk. Raises on any failure; the slots' contents do not matter
        afterwards (every position is written before it is read)."""
        start = next((t for t in (self.spec.bos_id, self.spec.eos_id) if t is not None), 0)
        r, n = self._runner, self._runner.num_slots
        chunk = max(1, min(self.config.prefill_chunk_tokens, self.spec.max_length // 2))
        pair = [PrefillRow(0, [start] * chunk, 0)] + ([PrefillRow(1, [start], 0)] if n > 1 else [])
        self._check_logits(r.prefill(pair, first_prompt=True)[:, 0], len(pair), "prefill")
        more = r.prefill([PrefillRow(0, [start] * 2, chunk)], first_prompt=False)
        self._check_logits(more[:, -1], 1, "prefill chunk")
        rows = [DecodeRow(slot, start, 1) for slot in range(n) if slot != 1 or n == 1]
        self._check_logits(r.decode(rows, {1: 1}), len(rows), "step")   # slot 1 sits in the range, idle
        if r.mixed_session is not None:
            dec, pre = r.decode_and_prefill(rows, {}, [PrefillRow(1 if n > 1 else 0, [start] * chunk, 0)], True)
            self._check_logits(dec, len(rows), "mixed step")
            self._check_logits(pre[:, -1], 1, "mixed chunk")

    # ------------------------------------------------------------------ metrics

    def _record_plan(self, plan: Plan) -> None:
        m = self._per_model
        if m is None:
            return
        if plan.decode:
            m.batch_size.observe(len(plan.decode))
        if plan.reused_tokens:
            m.prefix_reused_tokens.inc(plan.reused_tokens)
        chunks = sum(len(call.chunks) for call in plan.prefill) + len(plan.tails)
        if chunks:
            m.prefill_chunks.inc(chunks)
            m.prefill_tokens.inc(plan.prefill_tokens)

    def _record_gauges(self) -> None:
        super()._record_gauges()
        m = self._per_model
        if m is not None:
            m.slots_used.set(self._scheduler.occupied_slots)
            m.slots_total.set(self._scheduler.config.num_slots)
