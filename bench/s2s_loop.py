"""Closed-loop clients and the arrival-batching server loop of the seq2seq serving benchmark (bench/seq2seq.py).

Standard library only (with testing/closedloop.py): bench/s2s_peer.py imports it inside the peers' own
environments (bench/.venv-ct2 has no project dependencies).

    run_clients(n, sources, call)   n client threads; client c sends sources[c], sources[c + n], ... one after the
                                    other (the next when the previous answer is complete); every side gets the same
                                    sources in the same order, so each is fed the same arrivals
    await run_clients_async(n, sources, acall)
                                    the same arrivals from n coroutines on the running event loop (a client library
                                    whose calls are awaitables: ortserve's asyncio client)
    ArrivalBatcher(engine)          a server for an engine without continuous batching (CTranslate2's
                                    translate_batch, transformers' generate): a loop thread takes every request
                                    that has arrived (up to max_batch), runs them as ONE batch call, answers each,
                                    and starts over; a request arriving during a call waits for the next one.
                                    workers=2 runs two such loops on one queue (CTranslate2 with inter_threads 2:
                                    two batches at once, one per model replica)
"""
from __future__ import annotations

import math
import queue
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from testing.closedloop import Record, drive, drive_async, interleaved, percentile

__all__ = ["ArrivalBatcher", "Record", "run_clients", "run_clients_async", "summarize"]

# call(source, on_token) -> output tokens: one request, blocking; on_token() is called as its tokens appear.
Call = Callable[[Any, Callable[[], None]], list]
# acall(source, on_token) -> an awaitable of the output tokens: one request, on the running event loop.
AsyncCall = Callable[[Any, Callable[[], None]], Awaitable[list]]
# engine(sources, on_step) -> outputs: one batch; on_step(row) is called when row `row` gets a token.
Engine = Callable[[list, Callable[[int], None]], list]


def run_clients(n_clients: int, sources: Sequence[Any], call: Call) -> tuple[float, list[Record]]:
    """Every source through `call`, from n_clients threads that start together (a barrier) and each send their
    next request when the previous one is answered (testing/closedloop.py). Returns (wall seconds from the first
    send to the last answer, records in source order). An exception in a call is raised here, after every thread
    ended."""
    if n_clients < 1:
        raise ValueError(f"n_clients: must be >= 1, got {n_clients}")
    run = drive(lambda c, i, first: list(call(sources[i], first)), n_clients, interleaved(len(sources), n_clients))
    return run.span(), sorted(run.records, key=lambda r: r.index)


async def run_clients_async(n_clients: int, sources: Sequence[Any], call: AsyncCall) -> tuple[float, list[Record]]:
    """run_clients with n_clients coroutines on the running event loop instead of threads: the same requests from
    the same clients in the same order, the same answer."""
    if n_clients < 1:
        raise ValueError(f"n_clients: must be >= 1, got {n_clients}")

    async def one(c: int, i: int, first: Callable[[], None]) -> list:
        return list(await call(sources[i], first))
    run = await drive_async(one, n_clients, interleaved(len(sources), n_clients))
    return run.span(), sorted(run.records, key=lambda r: r.index)


@dataclass
class _Pending:
    source: Any
    on_token: Callable[[], None]
    answered: threading.Event = field(default_factory=threading.Event)
    output: list | None = None
    error: BaseException | None = None


class ArrivalBatcher:
    """One engine thread serving many callers: each round runs every request that has arrived as one batch.

    with ArrivalBatcher(engine, max_batch=32) as server:
        run_clients(8, sources, server.call)
    server.batches: the size of every batch it ran, in the order they started."""

    def __init__(self, engine: Engine, max_batch: int = 32, workers: int = 1) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch: must be >= 1, got {max_batch}")
        if workers < 1:
            raise ValueError(f"workers: must be >= 1, got {workers}")
        self.engine = engine
        self.max_batch = max_batch
        self.batches: list[int] = []
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._threads = [threading.Thread(target=self._loop, name=f"arrival-batcher-{i}", daemon=True)
                         for i in range(workers)]

    def __enter__(self) -> "ArrivalBatcher":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join()

    def call(self, source: Any, on_token: Callable[[], None]) -> list:
        pending = _Pending(source, on_token)
        self._queue.put(pending)
        pending.answered.wait()
        if pending.error is not None:
            raise pending.error
        assert pending.output is not None
        return pending.output

    def _loop(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self.max_batch:      # everything that has arrived by now, nothing more
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            with self._lock:
                self.batches.append(len(batch))
            try:
                outputs = self.engine([p.source for p in batch], lambda row: batch[row].on_token())
                if len(outputs) != len(batch):
                    raise RuntimeError(f"engine answered {len(outputs)} of {len(batch)} requests")
                for p, out in zip(batch, outputs):
                    p.output = list(out)
            except BaseException as e:      # noqa: BLE001 - every caller of the batch gets it
                for p in batch:
                    p.error = e
            for p in batch:
                p.answered.set()


def summarize(wall: float, records: Sequence[Record], count: Callable[[list], int] = len) -> dict[str, float]:
    """tokens/s over the wall time, time to first token p50 / p90 (ms), requests; count(output) = its tokens."""
    tokens = sum(count(r.output) for r in records)
    ttfts = [1000 * r.ttft for r in records]
    return {"tokens": tokens, "requests": len(records), "wall_s": wall,
            "tokens_per_s": tokens / wall if wall > 0 else math.nan,
            "ttft_p50_ms": percentile(ttfts, 50), "ttft_p90_ms": percentile(ttfts, 90)}
