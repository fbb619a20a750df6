"""When to retry and how long to wait (shared by the sync and asyncio clients)."""
from __future__ import annotations

import logging
import random
import time

import grpc

from .config import Backoff, ClientConfig
from .errors import OrtserveError

log = logging.getLogger(__name__)

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


class Attempts:
    """The attempts of one logical call (both clients' loop, which only sleeps or awaits in between):

        while True:
            timeout = attempts.time_left()      # DEADLINE_EXCEEDED once none is left
            try:
                return rpc(request, timeout=timeout)
            except grpc.RpcError as e:
                attempts.failed(e)
            sleep(attempts.wait_time())         # raises the failure when it is not to be retried
    """

    def __init__(self, config: ClientConfig, timeout: float | None, what: str) -> None:
        self._deadline = Deadline(timeout)
        self._retries = config.retries
        self._backoff = config.backoff
        self._what = what       # the call, as the retry log names it
        self._attempt = 0
        self._last: OrtserveError | None = None   # set by failed() before any wait_time()

    def time_left(self) -> float | None:
        """The next attempt's timeout (None: no deadline)."""
        left = self._deadline.remaining()
        if left is not None and left <= 0:
            raise deadline_error(self._attempt, self._last)
        return left

    def failed(self, error: grpc.RpcError) -> None:
        self._last = OrtserveError.from_rpc_error(error)

    def wait_time(self) -> float:
        """Seconds to wait before the next attempt; the last failure is raised (as OrtserveError) when it is not
        retryable or no retries are left (outside the caller's `except`, so it chains to nothing)."""
        last = self._last
        if not should_retry(last, self._attempt, self._retries):
            raise last
        delay = self._deadline.wait_time(backoff_delay(self._backoff, self._attempt))
        log.info("retrying %s after %s (attempt %d of %d, waiting %.2fs)", self._what, last, self._attempt + 1,
                 self._retries, delay)
        self._attempt += 1
        return delay
