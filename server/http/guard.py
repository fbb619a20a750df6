"""The guard every HTTP route runs in, and what the routes share.

A route is a converter: request -> one data-plane call -> response. The guard around it checks the bearer
token (health routes stay open, as grpc.health.v1 does), turns any exception into the route family's error
body with errors.py's status, and records the same per-model request metrics as the gRPC servicers.
"""
from __future__ import annotations

import asyncio
import functools
import hmac
import time
from typing import Any, AsyncIterator, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from server.runtime import tracing
from server.dataplane import DataPlane
from server.protocol.errors import Code, ServingError
from server.http.errors import HttpError, classify_error, kserve_body, openai_body

KSERVE = "kserve"
OPENAI = "openai"
Handler = Callable[["Door", Request], Awaitable[Response]]


class Door:
    """What the routes share: the data plane, the body limit, the token, the request metrics."""

    def __init__(self, plane: DataPlane, max_body_bytes: int, auth_token: str | None) -> None:
        self.plane = plane
        self.max_body_bytes = max_body_bytes
        self._expected = f"Bearer {auth_token}".encode() if auth_token else None

    def authorize(self, request: Request) -> None:
        if self._expected is None:
            return
        given = request.headers.get("authorization")
        if given is None:
            raise HttpError(401, "authorization: missing 'Authorization: Bearer <token>' header")
        if not hmac.compare_digest(given.encode("latin-1", errors="replace"), self._expected):
            raise HttpError(401, "authorization: invalid bearer token")

    def record(self, model: str, method: str, code: str, started: float) -> None:
        self.plane.record_request(model, method, code, time.perf_counter() - started)


def error_response(flavor: str, status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    body = openai_body(status, message) if flavor == OPENAI else kserve_body(message)
    return JSONResponse(body, status_code=status, headers=headers)


def route(method: str, flavor: str, open_route: bool = False) -> Callable[[Handler], Callable[[Request], Any]]:
    """Wraps a handler: auth, the error mapping, metrics. `request.state.model` names the model for metrics
    when the path does not."""
    def wrap(fn: Handler) -> Callable[[Request], Any]:
        @functools.wraps(fn)
        async def endpoint(request: Request) -> Response:
            door: Door = request.app.state.door
            started = time.perf_counter()
            code = "CANCELLED"
            streaming = False
            # the request id, and the door's span when tracing (child of the caller's traceparent)
            span = tracing.start_door("http", method, request.headers)
            token = tracing.use(span)
            try:
                if not open_route:
                    door.authorize(request)
                response = await _while_connected(request, fn(door, request))
                code = "OK"
                if isinstance(response, StreamingResponse):  # recorded when its last event is sent, as gRPC streams
                    streaming = True
                    response.body_iterator = _recorded(response.body_iterator, door, request, method, started,
                                                       span)
                return response
            except Exception as exc:
                status, message, code = classify_error(exc, f"http {method}")
                headers = {"www-authenticate": "Bearer"} if status == 401 else None
                return error_response(flavor, status, message, headers)
            finally:
                tracing.reset(token)
                if not streaming:
                    door.record(_model_of(request), f"http.{method}", code, started)
                    tracing.end(span, code=code)
        return endpoint
    return wrap


async def _while_connected(request: Request, handler: Awaitable[Response]) -> Response:
    """The handler's answer, unless the client disconnects first: then the handler is cancelled, and with it
    every generation or batch it awaits (none is left computing for nobody), and the request ends CANCELLED.
    The connection is watched once the body is read (read_body signals it): until then the handler's own reads
    see a disconnect. A streamed answer watches its own connection once it is returned (Starlette)."""
    body_read = request.state.body_read = asyncio.Event()
    work = asyncio.ensure_future(handler)
    watch = asyncio.ensure_future(_disconnected(request, body_read))
    try:
        await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not watch.done():
            watch.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
    if work.cancelled() and watch.done() and not watch.cancelled():
        raise ServingError(Code.CANCELLED, "client: disconnected before the answer; its work was cancelled")
    return work.result()


async def _disconnected(request: Request, body_read: asyncio.Event) -> None:
    await body_read.wait()
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _model_of(request: Request) -> str:
    return getattr(request.state, "model", None) or request.path_params.get("model", "")


async def _recorded(events: AsyncIterator[Any], door: Door, request: Request, method: str,
                    started: float, span: Any = None) -> AsyncIterator[Any]:
    """A stream's events; its request is counted once they are all sent (CANCELLED when the client left)."""
    code = "CANCELLED"
    try:
        async for event in events:
            yield event
        code = "OK"
    finally:
        door.record(_model_of(request), f"http.{method}", code, started)
        tracing.end(span, code=code)
