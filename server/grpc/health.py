"""grpc.health.v1.Health computed from the data plane on every call (no state to keep in sync).

Service names: "" (and the two API service names) = the whole server: SERVING once the repository is
loaded, NOT_SERVING while draining (a readiness probe). "liveness" = SERVING whenever the process answers,
loading and draining included (a liveness probe must not restart a server that is loading or draining).
A model name = SERVING when one of its versions is.
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2 as pb
from grpc_health.v1 import health_pb2_grpc as pb_grpc

from server.dataplane import DataPlane

SERVER_NAMES = ("", "ortserve.v1.TaskService", "inference.GRPCInferenceService")
LIVENESS_NAME = "liveness"
OPEN_NAMES = (*SERVER_NAMES, LIVENESS_NAME)  # answered without the bearer token (probes send no metadata)
_WATCH_PERIOD_S = 0.5


class HealthServicer(pb_grpc.HealthServicer):
    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    def status_of(self, service: str) -> "pb.HealthCheckResponse.ServingStatus.ValueType | None":
        serving, not_serving = pb.HealthCheckResponse.SERVING, pb.HealthCheckResponse.NOT_SERVING
        if service == LIVENESS_NAME:
            return serving
        if service in SERVER_NAMES:
            return serving if self.plane.ready else not_serving
        healthy = self.plane.model_health(service)
        if healthy is None:
            return None
        return serving if healthy else not_serving

    async def Check(self, request: pb.HealthCheckRequest, context: grpc.aio.ServicerContext) -> pb.HealthCheckResponse:
        status = self.status_of(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return pb.HealthCheckResponse(status=status)

    async def Watch(self, request: pb.HealthCheckRequest,
                    context: grpc.aio.ServicerContext) -> AsyncIterator[pb.HealthCheckResponse]:
        last = None
        while True:
            status = self.status_of(request.service)
            if status is None:
                status = pb.HealthCheckResponse.SERVICE_UNKNOWN
            if status != last:
                last = status
                yield pb.HealthCheckResponse(status=status)
            await asyncio.sleep(_WATCH_PERIOD_S)

    async def List(self, request: pb.HealthListRequest, context: grpc.aio.ServicerContext) -> pb.HealthListResponse:
        response = pb.HealthListResponse()
        for name in (*SERVER_NAMES, LIVENESS_NAME, *self.plane.model_names()):
            status = self.status_of(name)
            if status is not None:
                response.statuses[name].status = status
        return response
