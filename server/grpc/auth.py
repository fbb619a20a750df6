"""Optional bearer-token authentication: `authorization: Bearer <token>` metadata on every call.

What stays open without the token is what tells nothing of the models (docs/protocol.md, Authentication):
grpc.health.v1 Check and Watch of the whole server (service "", one of the API service names, or "liveness"), so
that load balancers and orchestrators can probe without the secret. The health of a named service needs the
token, whether the name is a model's or not: the answer (SERVING / NOT_SERVING / NOT_FOUND) would tell real
model names from unknown ones. Health/List (every model name) needs it like everything else.
"""
from __future__ import annotations

import hmac
from typing import Any, AsyncIterator, Awaitable, Callable

import grpc

from server.grpc.health import OPEN_NAMES

HEALTH_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})


def _denial(handler: grpc.RpcMethodHandler | None, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same streaming kind as the real one that answers UNAUTHENTICATED."""
    async def abort(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def abort_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # never reached; makes this an async generator

    request_streaming = handler is not None and handler.request_streaming
    response_streaming = handler is not None and handler.response_streaming
    if request_streaming and response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort_stream)
    if request_streaming:
        return grpc.stream_unary_rpc_method_handler(abort)
    if response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort_stream)
    return grpc.unary_unary_rpc_method_handler(abort)


def _server_health_only(handler: grpc.RpcMethodHandler, problem: str) -> grpc.RpcMethodHandler:
    """Health Check / Watch for a caller without the token: the whole server's status, UNAUTHENTICATED for any named
    service (checked before the name is looked up, so a real name and an unknown one get the same answer)."""
    message = f"{problem} (without it, health answers only for the whole server: service '')"
    if handler.unary_unary is not None:
        check = handler.unary_unary

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if request.service not in OPEN_NAMES:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
            return await check(request, context)

        return grpc.unary_unary_rpc_method_handler(unary, request_deserializer=handler.request_deserializer,
                                                   response_serializer=handler.response_serializer)
    watch = handler.unary_stream

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if request.service not in OPEN_NAMES:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        async for response in watch(request, context):
            yield response

    return grpc.unary_stream_rpc_method_handler(stream, request_deserializer=handler.request_deserializer,
                                                response_serializer=handler.response_serializer)


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def problem(self, details: grpc.HandlerCallDetails) -> str | None:
        """None when the call carries the token, else what is wrong with it."""
        given = next((v for k, v in (details.invocation_metadata or ()) if k == "authorization"), None)
        if given is None:
            return "missing 'authorization: Bearer <token>' metadata"
        if hmac.compare_digest(given.encode() if isinstance(given, str) else given, self._expected):
            return None
        return "invalid bearer token"

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
            details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        problem = self.problem(details)
        handler = await continuation(details)
        if problem is None:
            return handler
        if details.method in HEALTH_METHODS and handler is not None:
            return _server_health_only(handler, problem)
        return _denial(handler, problem)
