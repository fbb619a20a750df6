"""Optional bearer-token authentication: `authorization: Bearer <token>` metadata on every call.

grpc.health.v1 Check and Watch stay open so load balancers and orchestrators can probe without the secret;
Health/List (every model name) needs the token like everything else.
"""
from __future__ import annotations

import hmac
from typing import Any, Awaitable, Callable

import grpc

OPEN_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})


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


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
            details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        if details.method in OPEN_METHODS:
            return await continuation(details)
        given = next((v for k, v in (details.invocation_metadata or ()) if k == "authorization"), None)
        if given is None:
            problem = "missing 'authorization: Bearer <token>' metadata"
        elif hmac.compare_digest(given.encode() if isinstance(given, str) else given, self._expected):
            return await continuation(details)
        else:
            problem = "invalid bearer token"
        return _denial(await continuation(details), problem)
