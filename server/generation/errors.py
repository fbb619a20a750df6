"""The generation engine's exceptions as the data plane's one error type (server/protocol/errors.py): mapped in
one place, for a call's admission (engine_errors) and for a stream's later chunks (server/leases.py)."""
from __future__ import annotations

import contextlib
from typing import Iterator

from server.protocol.errors import Code, ServingError

from .results import EngineStoppedError, OverloadedError


def serving_error(exc: BaseException) -> BaseException:
    """The ServingError an engine exception answers as; anything else (a ServingError, a cancellation) unchanged."""
    if isinstance(exc, ValueError):
        return ServingError(Code.INVALID_ARGUMENT, str(exc))
    if isinstance(exc, OverloadedError):
        return ServingError(Code.RESOURCE_EXHAUSTED, str(exc))
    if isinstance(exc, TimeoutError):
        return ServingError(Code.DEADLINE_EXCEEDED, str(exc) or "deadline exceeded")
    if isinstance(exc, EngineStoppedError):
        return ServingError(Code.UNAVAILABLE, str(exc))
    if isinstance(exc, RuntimeError):
        return ServingError(Code.INTERNAL, str(exc))
    return exc


@contextlib.contextmanager
def engine_errors() -> Iterator[None]:
    """The generation engine's exceptions -> ServingError."""
    try:
        yield
    except (ValueError, TimeoutError, RuntimeError) as exc:
        raise serving_error(exc) from None
