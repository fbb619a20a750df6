"""The engine's worker thread: one call at a time from the event loop, its result back as an asyncio future.

What `loop.run_in_executor(ThreadPoolExecutor(1), ...)` gives, without what one reader and one writer do not need:
no concurrent.futures.Future between the two (its lock and condition, the callbacks that copy its state onto the
asyncio future), no work-item queue and thread-count bookkeeping per call. The engine hands its thread a call every
iteration, so that bookkeeping was a visible share of the event loop's time on short steps (bench/FINDINGS.md, "The
served g2p request's event loop").
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from typing import Any, Callable

logger = logging.getLogger(__name__)

_STOP = object()


class WorkerThread:
    """A daemon thread running the calls `submit` gives it, in order; `stop` ends it after the call in progress."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, loop: asyncio.AbstractEventLoop, fn: Callable[[Any], Any], arg: Any) -> asyncio.Future:
        """fn(arg) in the thread; the future (of `loop`, the running one) gets its result or its exception. A
        future cancelled meanwhile (the loop's task was) leaves the result to be dropped."""
        future = loop.create_future()
        self._calls.put((loop, fn, arg, future))
        return future

    def stop(self) -> None:
        """No more calls: the thread ends once the one in progress (if any) returns. Does not wait for it."""
        self._calls.put(_STOP)

    def _serve(self) -> None:
        while (call := self._calls.get()) is not _STOP:
            loop, fn, arg, future = call
            try:
                result, error = fn(arg), None
            except BaseException as exc:     # noqa: BLE001 - handed to the awaiting coroutine
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:     # the loop closed while the call ran: nobody waits for it
                logger.debug("worker thread %s: result dropped, its event loop is closed", self._thread.name)


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():        # cancelled while the thread computed
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
