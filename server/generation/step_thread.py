"""The engine's worker thread, and the hand-off of the GIL to it at each step.

A step's graph run releases the GIL, but the worker needs the GIL first, for ~0.1 ms of Python that builds the
feeds. Submitting the step wakes the worker; the event loop, still holding the GIL, goes on sending the chunks of
the step that just ended (gRPC writes, SSE events), so the worker waits for the GIL until the loop next blocks:
measured on the 2-core machine at batch 1 (124M Llama, w4), 0.3-0.7 ms from submit to the worker's first line
served over gRPC, against ~0.1 ms in-process, on a ~2.2 ms step. So the loop blocks after submitting (GIL
released) until the worker has started (at most HANDOFF_TIMEOUT_S): the worker is inside the graph run before
the loop's sends resume, and those sends overlap the run instead of delaying it.
"""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")
A = TypeVar("A")

# An upper bound, not the usual wait: the worker is idle when a step is submitted (one step at a time), so it starts
# within a thread wake-up (~0.05-0.1 ms measured); on a machine so loaded that it takes longer, the loop gives up
# after this long and goes on (other requests' I/O waits at most this much per step).
HANDOFF_TIMEOUT_S = 0.001


class StepThread:
    """One worker thread for one engine's steps (onnxruntime runs one step of a graph at a time)."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._started = threading.Event()

    async def run(self, fn: Callable[[A], T], arg: A) -> T:
        """fn(arg) in the worker thread; the loop blocks until the worker has started it."""
        started = self._started
        started.clear()

        def call() -> T:
            started.set()
            return fn(arg)

        future = asyncio.get_running_loop().run_in_executor(self._pool, call)
        started.wait(HANDOFF_TIMEOUT_S)
        return await future

    def shutdown(self) -> None:
        """A step still running finishes on its own; nothing waits for it (the event loop must not block)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["HANDOFF_TIMEOUT_S", "StepThread"]
