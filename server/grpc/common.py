"""What every servicer shares: the data plane, deadlines, and the unary / streaming handler wrappers."""
from __future__ import annotations

import functools
import time
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import grpc

from server.dataplane import DataPlane
from server.grpc.status import guarded

T = TypeVar("T")


def deadline_of(context: grpc.aio.ServicerContext) -> float | None:
    """The call's deadline as a time.monotonic() value (None when the client set none)."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


class Instrumented:
    """Base of the servicers: `self.plane` and the per-model request / latency metrics."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    def record(self, model: str, method: str, code: str, started: float) -> None:
        self.plane.record_request(model, method, code, time.perf_counter() - started)


def unary(method: str, model_field: str = "model") -> Callable[..., Any]:
    """Wraps a unary handler in the status guard (server/grpc/status.py)."""
    def wrap(fn: Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        @functools.wraps(fn)
        async def handler(self: Instrumented, request: Any, context: grpc.aio.ServicerContext) -> T:
            async with guarded(self, method, getattr(request, model_field, "") if model_field else "", context):
                return await fn(self, request, context)
            raise AssertionError("unreachable")  # the guard either returns the value or aborts (raises)
        return handler
    return wrap


def streaming(method: str, model_field: str = "model") -> Callable[..., Any]:
    """unary() for server-streaming handlers."""
    def wrap(fn: Callable[[Any, Any, grpc.aio.ServicerContext], AsyncIterator[T]]) -> Callable[..., AsyncIterator[T]]:
        @functools.wraps(fn)
        async def handler(self: Instrumented, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[T]:
            async with guarded(self, method, getattr(request, model_field, ""), context):
                async for item in fn(self, request, context):
                    yield item
        return handler
    return wrap
