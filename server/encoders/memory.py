"""Memory given back to the system after large encoder requests.

A request of 1,024 long texts allocates gigabytes in many small pieces (the tokenizer's encodings, the answer's
Python objects); once freed, glibc's allocator keeps them in its arenas, so the process stayed gigabytes larger
after the request (issue 40, kind 6). `malloc_trim(0)` returns free memory of every arena to the kernel. It runs
in a worker thread (it walks the heaps), `DELAYS_S` after the last large request left the encoder: the first soon,
the second once the door has built and sent a large answer; several large requests in a row trim once each time. Where the C library has no malloc_trim (musl,
macOS) nothing is done.
"""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import logging
from typing import Any, Awaitable, Callable, TypeVar

log = logging.getLogger(__name__)
Method = TypeVar("Method", bound=Callable[..., Awaitable[Any]])

LARGE_REQUEST_CHARS = 1 << 20   # a request with this much text (or more) is followed by a trim
DELAYS_S = (1.0, 5.0)


def _malloc_trim() -> Callable[[], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: int(trim(0))


class MemoryReturner:
    """Schedules the trims DELAYS_S after the last large request (loop thread only)."""

    def __init__(self, trim: Callable[[], int] | None) -> None:
        self._trim = trim
        self._handles: list[asyncio.TimerHandle] = []
        self.trims = 0

    def after_request(self, chars: int) -> None:
        if self._trim is None or chars < LARGE_REQUEST_CHARS:
            return
        for handle in self._handles:
            handle.cancel()
        loop = asyncio.get_running_loop()
        self._handles = [loop.call_later(delay, self._start) for delay in DELAYS_S]

    def _start(self) -> None:
        task = asyncio.get_running_loop().run_in_executor(None, self._run)
        task.add_done_callback(lambda done: done.exception())   # _run logs its own failures

    def _run(self) -> None:
        assert self._trim is not None
        try:
            self._trim()
            self.trims += 1
        except OSError as exc:
            log.debug("malloc_trim failed: %s", exc)


RETURNER = MemoryReturner(_malloc_trim())


def after_request(chars: int) -> None:
    """Call when a request of `chars` characters of text has left the encoder (answered or failed)."""
    RETURNER.after_request(chars)


def returning_memory(method: Method) -> Method:
    """Decorates an async encoder method whose first argument holds the request's texts: after it,
    `after_request` with their characters."""
    @functools.wraps(method)
    async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await method(self, *args, **kwargs)
        finally:
            after_request(text_chars(args[0] if args else next(iter(kwargs.values()), ())))
    return call  # type: ignore[return-value]


def text_chars(texts: Any) -> int:
    """Characters of a list of texts, of (text, pair) tuples, or of a Pairs' two sides (0 for anything else)."""
    if hasattr(texts, "left") and hasattr(texts, "right"):
        return text_chars(texts.left) + text_chars(texts.right)
    if not isinstance(texts, list):
        return 0
    return sum(len(t) if isinstance(t, str) else sum(len(p or "") for p in t if isinstance(p, str))
               for t in texts if isinstance(t, (str, tuple)))


__all__ = ["DELAYS_S", "LARGE_REQUEST_CHARS", "MemoryReturner", "after_request", "returning_memory", "text_chars"]
