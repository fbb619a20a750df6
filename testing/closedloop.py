"""The one closed-loop driver of the benchmarks and the load generator, and the one percentile function.

Standard library only: bench/s2s_peer.py imports it inside the peers' own environments.

N clients, each sending its next request when the previous one is answered. Which requests a client sends is
its `indices(client)`: an iterator of request numbers, from one of the plans below. `seconds` also bounds the run
(a request already sent finishes). The call is `call(client, i, first) -> output`; `first()` marks the request's
first token (a streamed answer), and a request that never calls it has its time to first token = its latency.

    run = drive(call, 8, per_client(50))                     # threads, started together (a barrier)
    run = await drive_async(acall, 16, shared(400))          # coroutines on this event loop
    run.wall, run.records, run.latencies(), run.span()

errors="raise": the first exception stops every client and is raised after they end; errors="record": it is
kept in the request's Record (its `error`), the client pauses `error_pause` seconds and goes on.
"""
from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

Indices = Callable[[int], Iterator[int]]


def percentile(samples: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of the samples (numpy's default); NaN for none."""
    if not samples:
        return float("nan")
    s = sorted(samples)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def per_client(n: int) -> Indices:
    """Every client sends requests 0 .. n-1 of its own."""
    return lambda c: iter(range(n))


def interleaved(total: int, clients: int) -> Indices:
    """Client c sends c, c + clients, c + 2 * clients, ... below `total` (every side gets the same arrivals)."""
    return lambda c: iter(range(c, total, clients))


def shared(total: int) -> Indices:
    """`total` requests in all, numbered in the order the clients take them."""
    counter = itertools.count()
    lock = threading.Lock()

    def take(c: int) -> Iterator[int]:
        while True:
            with lock:
                i = next(counter)
            if i >= total:
                return
            yield i
    return take


def counting(start: Callable[[int], int] = lambda c: 0) -> Indices:
    """No bound of its own (use `seconds`): client c counts on from start(c)."""
    return lambda c: itertools.count(start(c))


@dataclass
class Record:
    """One request as its client saw it (time.perf_counter() seconds)."""

    client: int
    index: int
    sent: float
    done: float
    first: float | None = None    # its first token (None: none was marked before the answer)
    output: Any = field(default_factory=list)
    error: BaseException | None = None

    @property
    def latency(self) -> float:
        return self.done - self.sent

    @property
    def ttft(self) -> float:
        """Time to first token; a request whose tokens were never seen one by one: time to the whole answer."""
        return (self.first if self.first is not None else self.done) - self.sent


@dataclass
class Run:
    wall: float                   # from the clients' start to the last one's end
    records: list[Record]         # in the order the requests were answered

    def ok(self) -> list[Record]:
        return [r for r in self.records if r.error is None]

    def latencies(self) -> list[float]:
        return [r.latency for r in self.ok()]

    def span(self) -> float:
        """From the first send to the last answer (0 for none)."""
        return max(r.done for r in self.records) - min(r.sent for r in self.records) if self.records else 0.0


class _Loop:
    """What the thread and coroutine clients share: the stop rule, the records, the first error."""

    def __init__(self, clients: int, indices: Indices, seconds: float | None, errors: str) -> None:
        if clients < 1:
            raise ValueError(f"clients: must be >= 1, got {clients}")
        if errors not in ("raise", "record"):
            raise ValueError(f"errors: 'raise' or 'record', got {errors!r}")
        self.clients, self.indices, self.seconds, self.errors = clients, indices, seconds, errors
        self.records: list[Record] = []
        self.failed: list[BaseException] = []
        self.stop_at = float("inf")

    def start(self) -> float:
        t0 = time.perf_counter()
        if self.seconds is not None:
            self.stop_at = t0 + self.seconds
        return t0

    def next_index(self, it: Iterator[int]) -> int | None:
        if self.failed or time.perf_counter() >= self.stop_at:
            return None
        return next(it, None)

    def done(self, c: int, i: int, sent: float, first: list[float], output: Any, error: BaseException | None) -> bool:
        """Keep the record; True when the client should stop (a raised error)."""
        if error is not None and self.errors == "raise":
            self.failed.append(error)
            return True
        self.records.append(Record(c, i, sent, time.perf_counter(), first[0] if first else None,
                                   output if error is None else None, error))
        return False

    def finish(self, t0: float) -> Run:
        if self.failed:
            raise self.failed[0]
        return Run(time.perf_counter() - t0, self.records)


def _marker(first: list[float]) -> Callable[[], None]:
    def mark() -> None:
        if not first:
            first.append(time.perf_counter())
    return mark


def drive(call: Callable[[int, int, Callable[[], None]], Any], clients: int, indices: Indices, *,
          seconds: float | None = None, errors: str = "raise", error_pause: float = 0.0,
          before_release: Callable[[], None] | None = None) -> Run:
    """Client threads, released together by a barrier; the wall time starts at the release. before_release() runs
    when every thread is ready, just before (e.g. to read CPU counters that should not count their start)."""
    loop = _Loop(clients, indices, seconds, errors)
    barrier = threading.Barrier(clients + 1)

    def client(c: int) -> None:
        it = loop.indices(c)
        barrier.wait()
        while (i := loop.next_index(it)) is not None:
            first: list[float] = []
            sent, output, error = time.perf_counter(), None, None
            try:
                output = call(c, i, _marker(first))
            except BaseException as exc:     # noqa: BLE001 - raised or recorded, as `errors` says
                error = exc
            if loop.done(c, i, sent, first, output, error):
                return
            if error is not None and error_pause:
                time.sleep(error_pause)

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    if before_release is not None:
        before_release()
    barrier.wait()
    t0 = loop.start()
    for t in threads:
        t.join()
    return loop.finish(t0)


async def drive_async(call: Callable[[int, int, Callable[[], None]], Awaitable[Any]], clients: int,
                      indices: Indices, *, seconds: float | None = None, errors: str = "raise",
                      error_pause: float = 0.0) -> Run:
    """Client coroutines on the running event loop, gathered; the wall time starts before the gather."""
    loop = _Loop(clients, indices, seconds, errors)

    async def client(c: int) -> None:
        it = loop.indices(c)
        while (i := loop.next_index(it)) is not None:
            first: list[float] = []
            sent, output, error = time.perf_counter(), None, None
            try:
                output = await call(c, i, _marker(first))
            except asyncio.CancelledError:
                raise
            except Exception as exc:     # noqa: BLE001 - raised or recorded, as `errors` says
                error = exc
            if loop.done(c, i, sent, first, output, error):
                return
            if error is not None and error_pause:
                await asyncio.sleep(error_pause)

    t0 = loop.start()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return loop.finish(t0)
