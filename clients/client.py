"""Synchronous client of the ortserve task API: the task methods (clients/methods.py) over a blocking channel."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

from .calls import Call, Stubs
from .channel import sync_channel
from .errors import OrtserveError
from .methods import TaskMethods
from .retry import Attempts

T = TypeVar("T")


class OrtserveClient(TaskMethods):
    """Blocking client; thread-safe (one channel, shared by all calls). Use as a context manager."""

    def _connect(self) -> None:
        self._channel = sync_channel(self._spec)
        self._stubs = Stubs.on(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "OrtserveClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unary(self, timeout: float | None, build: Callable[..., Call[T]], *args: Any) -> T:
        call = build(*args)
        rpc = self._stubs.method(call)
        attempts = self._attempts(timeout, call.rpc)
        while True:
            left = attempts.time_left()
            try:
                response = rpc(call.request, timeout=left, metadata=self._metadata)
            except grpc.RpcError as e:
                attempts.failed(e)
            else:
                return call.result(response)
            time.sleep(attempts.wait_time())

    def _stream(self, call: Call[T], attempts: Attempts) -> Iterator[T]:
        rpc = self._stubs.method(call)
        while True:
            left = attempts.time_left()
            responses = rpc(call.request, timeout=left, metadata=self._metadata)
            try:
                first = next(responses)
                break
            except StopIteration:
                return
            except grpc.RpcError as e:
                attempts.failed(e)
            time.sleep(attempts.wait_time())
        try:
            yield call.result(first)
            for message in responses:
                yield call.result(message)
        except grpc.RpcError as e:
            raise OrtserveError.from_rpc_error(e) from None
        finally:
            responses.cancel()  # no-op once finished; stops generation if the caller left early
