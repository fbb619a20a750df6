"""The operational routes vLLM serves beside its OpenAI API, so that probes and scrapers set up for it work here:

    GET /health    200 while the server is ready (repository loaded, not draining), else 503; no token needed
    GET /metrics   the Prometheus exposition of the server's metrics (the same as on --metrics-port); it names
                   every model, version and request count, so with --auth-token it needs the token, as on that
                   port (docs/protocol.md, Authentication)
"""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from server.http.guard import KSERVE, Door, route

@route("Health", KSERVE, open_route=True)
async def health(door: Door, request: Request) -> Response:
    return Response(status_code=200 if door.plane.ready else 503)


@route("Metrics", KSERVE)
async def metrics(door: Door, request: Request) -> Response:
    return Response(door.plane.metrics_exposition(), media_type=CONTENT_TYPE_LATEST)


def routes() -> list[Route]:
    return [Route("/health", health, methods=["GET"]), *metrics_routes()]


def metrics_routes() -> list[Route]:
    return [Route("/metrics", metrics, methods=["GET"])]
