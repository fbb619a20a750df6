"""Continuous batching over a decoder graph that grows its cache with Concat (packages with cache.layout "concat").

The running batch's cache lives in numpy arrays (kvcache.BatchCache), left-padded so rows line up. Each
iteration drops finished rows, prefills admitted requests together (left-padded, past 0) and runs ONE
decode step for every active sequence. Kept for packages published before the in-place graph; new
packages use SlotEngine.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from itertools import chain
from typing import Iterable

import numpy as np

from .engine import GenerationEngine
from .kvcache import BatchCache
from .results import FINISH_CANCELLED
from .runner import DecoderRunner
from .sequence import Sequence

logger = logging.getLogger(__name__)


class ConcatEngine(GenerationEngine):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._runner = DecoderRunner(self.session, self.spec)
        self._waiting: deque[Sequence] = deque()
        self._active: list[Sequence] = []    # same order as the cache rows
        self._prefilling: list[Sequence] = []  # admitted, prefill running: still counted against the budget
        self._cache: BatchCache | None = None

    @property
    def active_sequences(self) -> int:
        return len(self._active)

    @property
    def waiting_requests(self) -> int:
        return len(self._waiting)

    def warmup(self) -> None:
        """Prefill (past 0) and one step at batch 1 and 2 (one row left-padded); raises on any failure."""
        start = next((t for t in (self.spec.bos_id, self.spec.eos_id) if t is not None), 0)
        for prompts in ([[start]], [[start, start, start], [start]]):
            logits, cache = self._runner.prefill(prompts)
            self._check_logits(logits, len(prompts), "prefill")
            logits, cache = self._runner.step(cache, np.argmax(logits, axis=1))
            self._check_logits(logits, len(prompts), "step")

    def _sequences(self) -> Iterable[Sequence]:
        return chain(self._waiting, self._prefilling, self._active)

    def _enqueue(self, seq: Sequence) -> None:
        self._waiting.append(seq)

    def _dequeue_waiting(self, seq: Sequence) -> bool:
        try:
            self._waiting.remove(seq)
            return True
        except ValueError:
            return False

    def _has_work(self) -> bool:
        return bool(self._active or self._waiting)

    def _clear(self) -> None:
        self._waiting.clear()
        self._prefilling = []
        self._active.clear()
        self._cache = None

    async def _iterate(self) -> bool:
        admitted = self._admit()
        if admitted:
            self._prefilling = admitted
            try:
                await self._prefill(admitted)
            finally:
                self._prefilling = []
        if self._active:
            await self._step()
        return bool(admitted or self._active)

    def _retire(self) -> None:
        """Drop rows that are done, cancelled, or past their deadline."""
        now = time.monotonic()
        for seq in self._active:
            if seq.cancelled and not seq.done:
                seq.finish_reason = FINISH_CANCELLED    # nobody listens: no chunk
            elif seq.deadline is not None and seq.deadline <= now:
                seq.finish(FINISH_CANCELLED)
        keep = [row for row, seq in enumerate(self._active) if not seq.done]
        if len(keep) == len(self._active):
            return
        self._active = [self._active[row] for row in keep]
        self._cache = self._cache.select(keep) if keep and self._cache is not None else None

    def _admit(self) -> list[Sequence]:
        """Waiting requests for the free slots, within the prefill token budget (at least one)."""
        now = time.monotonic()
        free = self.config.max_batch_size - len(self._active)
        chosen: list[Sequence] = []
        width = 0
        while self._waiting and len(chosen) < free:
            seq = self._waiting[0]
            if seq.cancelled or seq.done:
                self._waiting.popleft()
                continue
            if seq.deadline is not None and seq.deadline <= now:
                self._waiting.popleft()
                seq.fail(TimeoutError("deadline passed while waiting; nothing was generated"))
                continue
            new_width = max(width, len(seq.prompt_ids))
            if chosen and new_width * (len(chosen) + 1) > self.config.max_prefill_tokens:
                break
            self._waiting.popleft()
            chosen.append(seq)
            width = new_width
        return chosen

    async def _prefill(self, seqs: list[Sequence]) -> None:
        try:
            logits, cache = await self._in_thread(
                self._runner.prefill, [s.prompt_ids for s in seqs])
        except Exception as exc:
            logger.exception("prefill of %d prompts failed on %s", len(seqs), self._label)
            for seq in seqs:
                seq.fail(RuntimeError(f"prefill failed: {exc}"))
            return
        keep = []
        for row, seq in enumerate(seqs):
            if seq.cancelled:
                seq.finish_reason = FINISH_CANCELLED
                continue
            self._advance(seq, logits[row])
            if not seq.done:
                keep.append(row)
        if keep:
            self._cache = BatchCache.concat(self._cache, cache.select(keep))
            self._active.extend(seqs[row] for row in keep)

    async def _step(self) -> None:
        if self._cache is None:
            raise RuntimeError("decode step without a cache")
        tokens = np.asarray([seq.generated[-1] for seq in self._active], dtype=np.int64)
        try:
            logits, cache = await self._in_thread(self._runner.step, self._cache, tokens)
        except Exception as exc:
            logger.exception("decode step of %d sequences failed on %s", len(self._active), self._label)
            for seq in self._active:
                seq.fail(RuntimeError(f"decode step failed: {exc}"))
            self._active.clear()
            self._cache = None
            return
        self._cache = cache
        if self._per_model is not None:
            self._per_model.batch_size.observe(len(self._active))
        for row, seq in enumerate(self._active):
            if not seq.cancelled and not seq.done:
                self._advance(seq, logits[row])

