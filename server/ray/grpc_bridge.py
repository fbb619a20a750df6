"""The gRPC task API and KServe v2 gRPC through Ray Serve's gRPC proxy.

Ray's proxy serves the services registered with `grpc_servicer_functions` and calls the deployment method named
like the RPC with the decoded request (and `grpc_context`, its serializable context). `add_grpc_methods` gives
the replica class one such method per RPC of each service, unary and server-streaming alike, made from the
service descriptors (so RPCs added to the protos come along): each calls the server's own servicer
(server/grpc/task.py, server/grpc/inference_service.py), so the status mapping and metrics are the server's.

What the proxy does not carry: grpc.health.v1 (the proxy answers its own `ray.serve.RayServeAPIService`
Healthz instead), reflection, the client's deadline (Ray's `request_timeout_s` bounds calls instead), TLS (the
proxy's own). Client-streaming and bidirectional RPCs (KServe's ModelStreamInfer, not served by ortserve) are not
bridged. The bearer token (`--auth-token`) is checked here, as the server's interceptor does.
"""
from __future__ import annotations

import types
from typing import Any, AsyncIterator, Callable

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor

from protos import grpc_service_pb2, ortserve_pb2
from server.dataplane import DataPlane
from server.grpc.auth import BearerTokenInterceptor
from server.grpc.inference_service import KServeServicer
from server.grpc.task import TaskServicer

# For Ray Serve's gRPCOptions: import paths of the generated add_*_to_server functions.
SERVICER_FUNCTIONS = ["protos.ortserve_pb2_grpc.add_TaskServiceServicer_to_server",
                      "protos.grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server"]
SERVICES: dict[str, ServiceDescriptor] = {
    "TaskService": ortserve_pb2.DESCRIPTOR.services_by_name["TaskService"],
    "GRPCInferenceService": grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"],
}


class _Aborted(Exception):
    """Raised by abort(): Ray's replica turns it into the status set on its grpc_context."""


class _Context:
    """The part of grpc.aio.ServicerContext the servicers use, over Ray's RayServegRPCContext."""

    def __init__(self, ray_context: Any) -> None:
        self._ray = ray_context

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        self._ray.set_code(code)
        self._ray.set_details(details)
        raise _Aborted(details)

    def time_remaining(self) -> float | None:
        return None  # Ray's proxy does not pass the client's deadline on

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return list(self._ray.invocation_metadata())


def servicers(plane: DataPlane) -> dict[str, Any]:
    return {"TaskService": TaskServicer(plane), "GRPCInferenceService": KServeServicer(plane)}


def _check_token(token: str | None, context: _Context) -> str | None:
    if not token:
        return None
    details = types.SimpleNamespace(invocation_metadata=context.invocation_metadata())
    return BearerTokenInterceptor(token).problem(details)  # type: ignore[arg-type]


def _response_class(service: str, name: str) -> Any:
    return message_factory.GetMessageClass(SERVICES[service].methods_by_name[name].output_type)


def _unary(service: str, name: str) -> Callable[..., Any]:
    async def call(self: Any, request: Any, grpc_context: Any = None) -> Any:
        context = _Context(grpc_context)
        problem = _check_token(self.settings.auth_token, context)
        if problem is not None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, problem)
        answer = await getattr(self.grpc_servicers[service], name)(request, context)
        if isinstance(answer, bytes):   # a large answer the servicer encoded off the loop: Ray's proxy wants a message
            return _response_class(service, name).FromString(answer)
        return answer
    call.__name__ = name
    return call


def _server_streaming(service: str, name: str) -> Callable[..., Any]:
    async def call(self: Any, request: Any, grpc_context: Any = None) -> AsyncIterator[Any]:
        context = _Context(grpc_context)
        problem = _check_token(self.settings.auth_token, context)
        if problem is not None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, problem)
        async for response in getattr(self.grpc_servicers[service], name)(request, context):
            yield response
    call.__name__ = name
    return call


def add_grpc_methods(cls: type) -> list[str]:
    """Adds one method per unary or server-streaming RPC of SERVICES to cls; the names added. The instance
    needs `grpc_servicers` (servicers()) and `settings`."""
    added: list[str] = []
    for service, descriptor in SERVICES.items():
        for method in descriptor.methods:
            if method.client_streaming:
                continue
            if hasattr(cls, method.name):
                raise TypeError(f"{method.name}: two services' RPCs share a name; Ray routes by method name")
            maker = _server_streaming if method.server_streaming else _unary
            setattr(cls, method.name, maker(service, method.name))
            added.append(method.name)
    return added
