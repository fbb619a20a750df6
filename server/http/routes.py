"""The Starlette application of the HTTP front door: every route family's routes, each in the guard
(guard.py), and Starlette's own refusals (unknown route, wrong method) in the family's error shape.
"""
from __future__ import annotations

import logging

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from server.dataplane import DataPlane
from server.http import classify, inference_rest as kserve, openai, ops, tei_embed, token_classify, zero_shot
from server.http.guard import KSERVE, OPENAI, Door, error_response

log = logging.getLogger(__name__)


def _flavor(path: str) -> str:
    return OPENAI if path.startswith("/v1/") or path == "/v1" else KSERVE


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (unknown route 404, wrong method 405) in the route family's error shape."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"path: no route {request.url.path!r} (see docs/protocol.md, HTTP)"
    elif exc.status_code == 405:
        message = f"method: {request.method} is not allowed on {request.url.path!r}"
    else:
        message = str(exc.detail)
    return error_response(_flavor(request.url.path), exc.status_code, message, dict(exc.headers or {}))


async def _internal(request: Request, exc: Exception) -> Response:
    log.error("http %s %s failed", request.method, request.url.path, exc_info=exc)
    return error_response(_flavor(request.url.path), 500, "internal error")


def build_app(plane: DataPlane, max_body_bytes: int, auth_token: str | None) -> Starlette:
    routes: list[Route] = [*kserve.routes(), *openai.routes(), *ops.routes(), *token_classify.routes(),
                          *classify.routes(), *zero_shot.routes(), *tei_embed.routes()]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_exception, Exception: _internal})
    app.state.door = Door(plane, max_body_bytes, auth_token)
    return app


def build_metrics_app(plane: DataPlane, auth_token: str | None) -> Starlette:
    """The metrics port's application: GET /metrics only, in the same guard as on the HTTP door (the token rule of
    docs/protocol.md, Authentication)."""
    app = Starlette(routes=ops.metrics_routes(),
                    exception_handlers={HTTPException: _http_exception, Exception: _internal})
    app.state.door = Door(plane, 0, auth_token)
    return app
