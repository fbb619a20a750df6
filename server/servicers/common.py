"""What every servicer method shares: status mapping, deadlines, per-model metrics."""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import grpc

from server.dataplane import DataPlane
from server.errors import Code, ServingError

log = logging.getLogger(__name__)

T = TypeVar("T")
STATUS = {code: grpc.StatusCode[code.value] for code in Code}


def deadline_of(context: grpc.aio.ServicerContext) -> float | None:
    """The call's deadline as a time.monotonic() value (None when the client set none)."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


class Instrumented:
    """Base of the servicers: `self.plane` and the per-model request / latency metrics."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    def model_label(self, name: str) -> str:
        # Only names of known models become label values: arbitrary client strings would explode cardinality.
        return name if name in self.plane.repository.names else ""

    def record(self, model: str, method: str, code: str, started: float) -> None:
        label = self.model_label(model)
        self.plane.metrics.requests.labels(label, method, code).inc()
        self.plane.metrics.request_latency.labels(label, method).observe(time.perf_counter() - started)


def unary(method: str, model_field: str = "model") -> Callable[..., Any]:
    """Wraps a unary handler: ServingError -> status, unexpected errors -> INTERNAL, metrics recorded."""
    def wrap(fn: Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        @functools.wraps(fn)
        async def handler(self: Instrumented, request: Any, context: grpc.aio.ServicerContext) -> T:
            started = time.perf_counter()
            model = getattr(request, model_field, "") if model_field else ""
            code = "OK"
            try:
                return await fn(self, request, context)
            except ServingError as exc:
                code = exc.code.value
                await context.abort(STATUS[exc.code], exc.message)
            except asyncio.CancelledError:
                code = "CANCELLED"
                raise
            except Exception:
                code = "INTERNAL"
                log.exception("%s failed", method)
                await context.abort(grpc.StatusCode.INTERNAL, f"{method}: internal error")
            finally:
                self.record(model, method, code, started)
            raise AssertionError("unreachable")  # context.abort always raises
        return handler
    return wrap


def streaming(method: str, model_field: str = "model") -> Callable[..., Any]:
    """unary() for server-streaming handlers."""
    def wrap(fn: Callable[[Any, Any, grpc.aio.ServicerContext], AsyncIterator[T]]) -> Callable[..., AsyncIterator[T]]:
        @functools.wraps(fn)
        async def handler(self: Instrumented, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[T]:
            started = time.perf_counter()
            model = getattr(request, model_field, "")
            code = "OK"
            try:
                async for item in fn(self, request, context):
                    yield item
            except ServingError as exc:
                code = exc.code.value
                await context.abort(STATUS[exc.code], exc.message)
            except (asyncio.CancelledError, GeneratorExit):
                code = "CANCELLED"
                raise
            except Exception:
                code = "INTERNAL"
                log.exception("%s failed", method)
                await context.abort(grpc.StatusCode.INTERNAL, f"{method}: internal error")
            finally:
                self.record(model, method, code, started)
        return handler
    return wrap
