"""Dynamic batcher for one encoder model version: the task calls and raw KServe ModelInfer share it.

Requests (each a few rows of graph inputs, `[rows, sequence]`) queue up; a batch closes when it holds
max_batch_size rows or when max_queue_delay has passed since its first request arrived (default 0: an idle
model runs a request at once). While a batch computes (in a worker thread: onnxruntime releases the GIL) the
next one fills, so batches grow with load without a fixed wait. Requests of different lengths are right-padded
to the batch's longest (each input with its own pad value; padded positions are masked). Expired requests are
dropped before compute; a cancelled one leaves the queue the moment it is cancelled. When a batch of several requests fails, each request is run alone, so a
bad request fails only itself.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from server.protocol.errors import Code, ServingError
from server.runtime.metrics import Metrics
from server.sessions import run_failure
from server.runtime.stats import ModelStats

log = logging.getLogger(__name__)

Feeds = dict[str, np.ndarray]
RunBatch = Callable[[Feeds], Feeds]


@dataclass(frozen=True)
class BatchConfig:
    max_batch_size: int = 16
    max_queue_delay_s: float = 0.0
    max_queued_requests: int = 256
    instances: int = 1           # batches computed at once (Triton's instance count): pair with intra-op threads


@dataclass(eq=False)  # identity: a cancelled request is removed from the queue by identity
class _Request:
    feeds: Feeds                 # every input [rows, sequence, ...]
    rows: int
    future: asyncio.Future[Feeds]
    enqueued: float  # time.monotonic()
    deadline: float | None  # time.monotonic() after which the caller has given up
    queued_since_perf: float = field(default_factory=time.perf_counter)


def combine(feeds: list[Feeds], pad_values: Mapping[str, int]) -> Feeds:
    """Concatenates requests along the batch axis, right-padding axis 1 to the longest (pad_values, else 0)."""
    if len(feeds) == 1:
        return feeds[0]
    out: Feeds = {}
    for name in feeds[0]:
        parts = [f[name] for f in feeds]
        if parts[0].ndim >= 2:
            width = max(p.shape[1] for p in parts)
            pad = pad_values.get(name, 0)
            parts = [p if p.shape[1] == width else
                     np.pad(p, [(0, 0), (0, width - p.shape[1])] + [(0, 0)] * (p.ndim - 2), constant_values=pad)
                     for p in parts]
        out[name] = np.concatenate(parts, axis=0)
    return out


class DynamicBatcher:
    def __init__(self, run_batch: RunBatch, pad_values: Mapping[str, int], config: BatchConfig, metrics: Metrics,
                 model_label: str, stats: ModelStats) -> None:
        self._run_batch = run_batch
        self._pad_values = dict(pad_values)
        self.config = config
        self._metrics = metrics
        self._label = model_label
        self._stats = stats
        self._pending: deque[_Request] = deque()
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # Labelled children looked up once: labels() locks and builds a key on every call, per request here.
        self._queued_gauge = metrics.queued_requests.labels(model_label)
        self._queue_time = metrics.queue_time.labels(model_label)
        self._batch_size = metrics.batch_size.labels(model_label)

    @property
    def queued(self) -> int:
        return len(self._pending)

    def start(self) -> None:
        """One loop per instance: each takes the next batch from the shared queue as soon as it is free."""
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._loop(), name=f"batcher:{self._label}:{i}")
                       for i in range(max(1, self.config.instances))]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        while self._pending:
            request = self._pending.popleft()
            if not request.future.done():
                request.future.set_exception(ServingError(Code.UNAVAILABLE, "model unloaded"))
        self._queued_gauge.set(0)

    async def submit(self, feeds: Feeds, deadline: float | None = None) -> Feeds:
        """Outputs for these rows (batch axis sliced; later axes padded to the batch's longest row)."""
        return await self.enqueue(feeds, deadline)

    def enqueue(self, feeds: Feeds, deadline: float | None = None) -> asyncio.Future[Feeds]:
        """Queues these rows; the future gets their outputs. Cancelling the future (or the task awaiting it)
        takes the rows out of the queue at once: nothing is computed for a caller who is gone."""
        rows = next(iter(feeds.values())).shape[0]
        if not 1 <= rows <= self.config.max_batch_size:
            raise ValueError(f"submit takes 1..{self.config.max_batch_size} rows, got {rows}")
        if not self._tasks:
            raise ServingError(Code.UNAVAILABLE, "model unloaded")
        if len(self._pending) >= self.config.max_queued_requests:
            raise ServingError(Code.RESOURCE_EXHAUSTED,
                               f"{self._label}: the queue is full ({len(self._pending)} pieces of requests waiting, "
                               f"max_queued_requests {self.config.max_queued_requests}); retry later")
        future: asyncio.Future[Feeds] = asyncio.get_running_loop().create_future()
        request = _Request(feeds, rows, future, time.monotonic(), deadline)
        self._pending.append(request)
        future.add_done_callback(lambda f: self._forget(request) if f.cancelled() else None)
        self._queued_gauge.set(len(self._pending))
        self._wakeup.set()
        return future

    def _forget(self, request: _Request) -> None:
        """A cancelled request leaves the queue (it may already have been taken into a batch)."""
        try:
            self._pending.remove(request)
        except ValueError:
            return
        self._queued_gauge.set(len(self._pending))

    async def _loop(self) -> None:
        while True:
            batch = await self._collect()
            if batch:
                await self._execute(batch)

    async def _collect(self) -> list[_Request]:
        while not self._pending:
            self._wakeup.clear()
            await self._wakeup.wait()
        close_at = self._pending[0].enqueued + self.config.max_queue_delay_s
        while self._rows_pending() < self.config.max_batch_size:
            remaining = close_at - time.monotonic()
            if remaining <= 0:
                break
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except TimeoutError:
                break
        return self._take()

    def _rows_pending(self) -> int:
        return sum(r.rows for r in self._pending)

    def _take(self) -> list[_Request]:
        """Pops live requests up to max_batch_size rows; fails expired ones, forgets cancelled ones."""
        batch: list[_Request] = []
        rows = 0
        now = time.monotonic()
        while self._pending:
            head = self._pending[0]
            if head.future.done():  # the caller went away (cancelled RPC)
                self._pending.popleft()
                continue
            if head.deadline is not None and now >= head.deadline:
                self._pending.popleft()
                head.future.set_exception(ServingError(Code.DEADLINE_EXCEEDED, "deadline passed while queued"))
                log.debug("dropped an expired request before compute", extra={"model": self._label})
                continue
            if rows + head.rows > self.config.max_batch_size:
                break
            batch.append(self._pending.popleft())
            rows += head.rows
        self._queued_gauge.set(len(self._pending))
        return batch

    async def _execute(self, batch: list[_Request]) -> None:
        rows = sum(r.rows for r in batch)
        start = time.perf_counter()
        waits = [start - r.queued_since_perf for r in batch]
        for wait in waits:
            self._queue_time.observe(wait)
        feeds = combine([r.feeds for r in batch], self._pad_values)
        try:
            outputs = await asyncio.get_running_loop().run_in_executor(None, self._run_batch, feeds)
        except Exception as exc:
            if len(batch) > 1:  # find the request that broke it: each runs alone, the others still get answers
                log.warning("batch of %d requests failed (%s); running them one by one", len(batch), exc,
                            extra={"model": self._label})
                for request in batch:
                    await self._execute([request])
                return
            log.info("request of %d rows failed: %s", rows, exc, extra={"model": self._label})
            if not batch[0].future.done():
                batch[0].future.set_exception(run_failure(exc))
            return
        self._batch_size.observe(rows)
        self._stats.record_execution(rows, time.perf_counter() - start, waits)
        offset = 0
        for request in batch:
            n = request.rows
            if not request.future.done():
                request.future.set_result({k: v[offset:offset + n] for k, v in outputs.items()})
            offset += n
