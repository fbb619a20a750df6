"""When to retry and how long to wait (shared by the sync and asyncio clients)."""
from __future__ import annotations

import random
import time

import grpc

from .config import Backoff
from .errors import OrtserveError

# Only "the server could not take the call" is safe to repeat: every other code is an answer.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})


def backoff_delay(backoff: Backoff, attempt: int, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry number `attempt` (0-based)."""
    base = min(backoff.maximum, backoff.initial * backoff.multiplier ** attempt)
    factor = 1.0 - backoff.jitter * (rng or random).random()
    return base * factor


class Deadline:
    """The time left for one logical call, across all its attempts."""

    def __init__(self, timeout: float | None) -> None:
        self._end = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> float | None:
        return None if self._end is None else self._end - time.monotonic()

    def expired(self) -> bool:
        left = self.remaining()
        return left is not None and left <= 0

    def wait_time(self, delay: float) -> float:
        left = self.remaining()
        return delay if left is None else max(0.0, min(delay, left))


def should_retry(error: OrtserveError, attempt: int, retries: int) -> bool:
    # An expired deadline is noticed by the caller's loop, which then raises DEADLINE_EXCEEDED.
    return error.code in RETRYABLE and attempt < retries


def deadline_error(attempts: int, last: OrtserveError | None) -> OrtserveError:
    detail = f" (last error: {last.code.name}: {last.message})" if last else ""
    return OrtserveError(grpc.StatusCode.DEADLINE_EXCEEDED, f"deadline exceeded after {attempts} attempt(s){detail}")
