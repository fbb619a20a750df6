"""Requests whose bytes do not parse are answered INVALID_ARGUMENT naming the field, not UNKNOWN.

grpcio's aio server runs a method's request deserializer before any of our code; when it raises (a string
field with invalid UTF-8, bytes that are no message at all) grpcio logs a traceback at ERROR and answers
UNKNOWN. Registering our services through SafeRegistrar gives every handler a deserializer that cannot raise: an undecodable request
becomes an `Undecodable` value, which the wrapped handler answers with INVALID_ARGUMENT (the field that holds
bad UTF-8 is named, server/grpc/wire.py), logged at DEBUG only (an unauthenticated caller must not be able to
fill the log).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

import grpc
from google.protobuf.message import DecodeError

from server.grpc.wire import bad_utf8_field

log = logging.getLogger(__name__)

Deserializer = Callable[[bytes], Any]


@dataclass(frozen=True)
class Undecodable:
    """A request that did not parse, with the reason to answer."""

    message: str


def safe_deserializer(deserialize: Deserializer) -> Callable[[bytes], Any]:
    message_class = getattr(deserialize, "__self__", None)
    descriptor = getattr(message_class, "DESCRIPTOR", None)
    type_name = getattr(descriptor, "full_name", "the request message")

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except (DecodeError, ValueError, TypeError, RuntimeError) as exc:
            field = bad_utf8_field(descriptor, data) if descriptor is not None else None
            if field is not None:
                return Undecodable(f"{field}: is not valid UTF-8 (string fields must be UTF-8)")
            return Undecodable(f"request: cannot be parsed as {type_name}: {exc}")
    return parse


def _refusing(behavior: Callable[..., Any], response_streaming: bool) -> Callable[..., Any]:
    if response_streaming:
        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                log.debug("refused an undecodable request: %s", request.message)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            async for item in behavior(request, context):
                yield item
        return stream

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            log.debug("refused an undecodable request: %s", request.message)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        return await behavior(request, context)
    return unary


def passing_bytes(serialize: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
    """A response serializer that passes bytes through: a handler may answer a message it encoded off the event
    loop (a large answer's encoding is CPU work the loop would otherwise wait for)."""
    if serialize is None:
        return None

    def encode(message: Any) -> bytes:
        return message if isinstance(message, bytes) else serialize(message)
    return encode


def safe_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """The same handler with a deserializer that cannot raise (unary-request handlers; others unchanged) and a
    serializer that passes encoded bytes through."""
    if handler.request_streaming or handler.request_deserializer is None:
        return handler
    deserializer = safe_deserializer(handler.request_deserializer)
    serializer = passing_bytes(handler.response_serializer)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(_refusing(handler.unary_stream, True),
                                                    request_deserializer=deserializer, response_serializer=serializer)
    return grpc.unary_unary_rpc_method_handler(_refusing(handler.unary_unary, False),
                                               request_deserializer=deserializer, response_serializer=serializer)


Wrap = Callable[[grpc.RpcMethodHandler], grpc.RpcMethodHandler]


def _same(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    return handler


class _SafeGenericHandler(grpc.GenericRpcHandler):
    """A service's handlers, each made safe once (looked up per call: one dict lookup, no interceptor)."""

    def __init__(self, inner: grpc.GenericRpcHandler, wrap: Wrap) -> None:
        self._inner = inner
        self._wrap = wrap
        self._safe: dict[str, grpc.RpcMethodHandler] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        found = self._safe.get(method)
        if found is None:
            inner = self._inner.service(handler_call_details)
            if inner is None:
                return None  # not this service's method (never cached: names come from clients)
            found = self._safe[method] = safe_handler(self._wrap(inner))
        return found


class SafeRegistrar:
    """Pass this instead of the server to the generated `add_*Servicer_to_server` functions: every handler
    they register gets a deserializer that cannot raise. `wrap` is applied to each handler first (server.py counts
    calls per connection with it)."""

    def __init__(self, server: grpc.aio.Server, wrap: Wrap = _same) -> None:
        self._server = server
        self._wrap = wrap

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self._server.add_generic_rpc_handlers(tuple(_SafeGenericHandler(h, self._wrap) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self._server.add_registered_method_handlers(
            service, {k: safe_handler(self._wrap(v)) for k, v in handlers.items()})


__all__ = ["SafeRegistrar", "Undecodable", "safe_deserializer", "safe_handler"]
