"""The one mapping from data-plane errors to gRPC status codes, and the guard every servicer method runs in
(status code, per-model request / latency metrics)."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

import grpc

from server.runtime import tracing
from server.protocol.errors import Code, ServingError

log = logging.getLogger(__name__)

STATUS = {code: grpc.StatusCode[code.value] for code in Code}


class Recorder(Protocol):
    def record(self, model: str, method: str, code: str, started: float) -> None: ...


def status_of(exc: Exception, method: str) -> tuple[grpc.StatusCode, str]:
    """ServingError -> its code and message; anything else is a bug: INTERNAL (logged with its traceback)."""
    if isinstance(exc, ServingError):
        return STATUS[exc.code], exc.message
    log.error("%s failed", method, exc_info=exc)
    return grpc.StatusCode.INTERNAL, f"{method}: internal error"


class guarded:
    """`async with guarded(recorder, method, model, context):` runs a handler body: an exception aborts the call
    with status_of's code; the outcome is recorded. (A class rather than a generator-based context manager: it
    wraps every RPC, and the generator machinery costs more.)"""

    __slots__ = ("_recorder", "_method", "_model", "_context", "_started", "_span", "_token")

    def __init__(self, recorder: Recorder, method: str, model: str, context: grpc.aio.ServicerContext) -> None:
        self._recorder, self._method, self._model, self._context = recorder, method, model, context

    async def __aenter__(self) -> None:
        self._started = time.perf_counter()
        # the request id, and the door's span when tracing (child of the caller's traceparent metadata)
        self._span = tracing.start_door("grpc", self._method, self._context.invocation_metadata() or ())
        self._token = tracing.use(self._span)

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        code = "OK"
        try:
            if kind is None:
                return False
            if issubclass(kind, (asyncio.CancelledError, GeneratorExit)):
                code = "CANCELLED"
            elif issubclass(kind, grpc.aio.AbortError):
                code = "ABORTED_BY_HANDLER"
            elif isinstance(exc, Exception):
                status, message = status_of(exc, self._method)
                code = status.name
                await self._context.abort(status, message)  # raises AbortError, which replaces exc
            return False
        finally:
            self._recorder.record(self._model, self._method, code, self._started)
            tracing.reset(self._token)
            tracing.end(self._span, code=code)
