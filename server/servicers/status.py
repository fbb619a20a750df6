"""The one mapping from data-plane errors to gRPC status codes, and the guard every servicer method runs in
(status code, per-model request / latency metrics)."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import AsyncIterator, Protocol

import grpc

from server.errors import Code, ServingError

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


@contextlib.asynccontextmanager
async def guarded(recorder: Recorder, method: str, model: str,
                  context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
    """Runs a handler body: an exception aborts the call with status_of's code; the outcome is recorded."""
    started = time.perf_counter()
    code = "OK"
    try:
        yield
    except (asyncio.CancelledError, GeneratorExit):
        code = "CANCELLED"
        raise
    except grpc.aio.AbortError:
        code = "ABORTED_BY_HANDLER"
        raise
    except Exception as exc:
        status, message = status_of(exc, method)
        code = status.name
        await context.abort(status, message)
    finally:
        recorder.record(model, method, code, started)
