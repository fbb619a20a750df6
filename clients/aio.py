"""asyncio client of the ortserve task API: the task methods (clients/methods.py), awaitable, over a grpc.aio
channel."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc

from .calls import Call, Stubs
from .channel import aio_channel
from .errors import OrtserveError
from .methods import TaskMethods
from .retry import Attempts

T = TypeVar("T")


class AsyncOrtserveClient(TaskMethods):
    """Awaitable client: the same methods as OrtserveClient, each returning an awaitable of its result
    (generate_stream: an async iterator). The channel is opened on first use, inside the running event loop
    (grpc.aio channels belong to the loop they were made in). Use `async with`."""

    def _connect(self) -> None:
        self._channel: grpc.aio.Channel | None = None
        self._stubs: Stubs | None = None

    def _open(self) -> Stubs:
        if self._channel is None:
            self._channel = aio_channel(self._spec)
            self._stubs = Stubs.on(self._channel)
        return self._stubs

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def __aenter__(self) -> "AsyncOrtserveClient":
        self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _unary(self, timeout: float | None, build: Callable[..., Call[T]], *args: Any) -> T:
        stubs = self._open()
        call = build(*args)
        rpc = stubs.method(call)
        attempts = self._attempts(timeout, call.rpc)
        while True:
            left = attempts.time_left()
            try:
                response = await rpc(call.request, timeout=left, metadata=self._metadata)
            except grpc.RpcError as e:
                attempts.failed(e)
            else:
                return call.result(response)
            await asyncio.sleep(attempts.wait_time())

    async def _stream(self, call: Call[T], attempts: Attempts) -> AsyncIterator[T]:
        rpc = self._open().method(call)
        while True:
            left = attempts.time_left()
            responses = rpc(call.request, timeout=left, metadata=self._metadata)
            try:
                message = await responses.read()
                break
            except grpc.RpcError as e:
                attempts.failed(e)
            await asyncio.sleep(attempts.wait_time())
        try:
            while message is not grpc.aio.EOF:
                yield call.result(message)
                message = await responses.read()
        except grpc.RpcError as e:
            raise OrtserveError.from_rpc_error(e) from None
        finally:
            responses.cancel()  # no-op once finished; stops generation if the caller left early
