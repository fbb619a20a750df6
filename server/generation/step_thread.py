"""The engine's worker thread, and the hand-off of the GIL to it at each step.

A step's graph run releases the GIL, but the worker needs the GIL before that, for ~0.1 ms of Python that builds the
feeds. Submitting the step wakes the worker; the event loop, still holding the GIL, goes on sending the chunks of
the step that just ended (gRPC writes, SSE events), so the worker waited for the GIL until the loop next blocked.
Traced per step on the 2-core machine (124M Llama, w4, batch 1, served over gRPC): 0.2-0.6 ms from submit to the
worker's first line, on a ~2.2 ms step. So after submitting, the loop blocks (GIL released) until the worker is
about to enter the graph (`entering_graph`, called by the runners), at most HANDOFF_TIMEOUT_S: the loop's sends then
overlap the run instead of delaying it. Waking the loop as soon as the worker started was tried first: the loop then
took the GIL back while the feeds were built, and the time moved from before the worker's first line to after it.
"""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")
A = TypeVar("A")

# An upper bound, not the usual wait: the worker is idle when a step is submitted (one step at a time), so it reaches
# the graph within a thread wake-up and its feeds (~0.15 ms traced); on a machine so loaded that it takes longer, the
# loop gives up after this long and goes on (other requests' I/O waits at most this much per step).
HANDOFF_TIMEOUT_S = 0.001

_worker = threading.local()      # .entered: the Event the submitting loop waits on, while a step has not run a graph


def entering_graph() -> None:
    """Called by a runner right before a graph run (which releases the GIL): lets the submitting loop go on. Once
    per step; a call outside a step (warmup, tests) does nothing."""
    entered = getattr(_worker, "entered", None)
    if entered is not None:
        _worker.entered = None
        entered.set()


class StepThread:
    """One worker thread for one engine's steps (onnxruntime runs one step of a graph at a time)."""

    def __init__(self, name: str, handoff_timeout_s: float = HANDOFF_TIMEOUT_S) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._entered = threading.Event()
        self._timeout = handoff_timeout_s

    async def run(self, fn: Callable[[A], T], arg: A) -> T:
        """fn(arg) in the worker thread; the loop blocks until it enters a graph (or ends, or the timeout)."""
        entered = self._entered
        entered.clear()

        def call() -> T:
            _worker.entered = entered
            try:
                return fn(arg)
            finally:          # a step that ran no graph (or failed before one) lets the loop go on too
                _worker.entered = None
                entered.set()

        future = asyncio.get_running_loop().run_in_executor(self._pool, call)
        entered.wait(self._timeout)
        return await future

    def shutdown(self) -> None:
        """A step still running finishes on its own; nothing waits for it (the event loop must not block)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["HANDOFF_TIMEOUT_S", "StepThread", "entering_graph"]
