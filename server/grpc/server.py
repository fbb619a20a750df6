"""The grpc.aio server of the gRPC front door: the task API, KServe v2, health and reflection over one data
plane, behind the bearer-token interceptor when a token is set, on a plaintext or TLS port.
"""
from __future__ import annotations

import logging

import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from protos import grpc_service_pb2, grpc_service_pb2_grpc, ortserve_pb2, ortserve_pb2_grpc
from server.dataplane import DataPlane
from server.grpc.auth import BearerTokenInterceptor
from server.grpc.decoding import SafeRegistrar
from server.grpc.health import HealthServicer
from server.grpc.inference_service import KServeServicer
from server.grpc.peers import CallTracker, IdleEvictor, tracked
from server.grpc.task import TaskServicer
from server.runtime.settings import ServerSettings

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    ortserve_pb2.DESCRIPTOR.services_by_name["TaskService"].full_name,
    grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name,
    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
    reflection.SERVICE_NAME,
)


def reflection_pool() -> descriptor_pool.DescriptorPool:
    """One pool with every served file: the KServe messages live outside the default pool."""
    pool = descriptor_pool.DescriptorPool()
    for module in (health_pb2, reflection_pb2, ortserve_pb2, grpc_service_pb2):
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    return pool


class GrpcServer:
    """The gRPC door's server; start() binds and serves, stop() ends it (after the data plane drained)."""

    def __init__(self, plane: DataPlane, settings: ServerSettings, max_connections: int = 0) -> None:
        """max_connections: connections the port holds (0: grpc's own default, none); beyond it gRPC closes new ones
        at once, so a flood of them cannot take the descriptors the other ports and the model files need
        (server/runtime/fdlimit.py). At the cap the idlest connections are closed for newcomers (peers.py)."""
        s = settings
        self.settings = settings
        options = [("grpc.max_send_message_length", s.max_message_bytes),
                   ("grpc.max_receive_message_length", s.max_message_bytes),
                   ("grpc.so_reuseport", 0),  # a second server on a busy port must fail, not share it
                   # A connection that does not finish its handshake (TLS, HTTP/2 settings) in time is closed
                   # (grpc's default waits 120 s), one without calls gets GOAWAY after the idle timeout.
                   ("grpc.server_handshake_timeout_ms", int(s.header_timeout * 1000)),
                   ("grpc.max_connection_idle_ms", int(s.grpc_idle_timeout * 1000))]
        tracker = CallTracker()
        self._evictor: IdleEvictor | None = None
        if max_connections > 0:
            options.append(("grpc.max_allowed_incoming_connections", max_connections))
            self._evictor = IdleEvictor(tracker, max_connections)
        interceptors = [BearerTokenInterceptor(s.auth_token)] if s.auth_token else []
        server = grpc.aio.server(options=options, interceptors=interceptors)
        # undecodable requests: INVALID_ARGUMENT naming the field (decoding.py); calls counted per peer (peers.py)
        services = SafeRegistrar(server, wrap=lambda handler: tracked(handler, tracker))
        ortserve_pb2_grpc.add_TaskServiceServicer_to_server(TaskServicer(plane), services)
        grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(KServeServicer(plane), services)
        health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(plane), services)
        reflection.enable_server_reflection(SERVICE_NAMES, server, pool=reflection_pool())
        self._server: grpc.aio.Server | None = server
        self.port = 0

    async def start(self) -> int:
        """Binds host:port (TLS when the settings carry a certificate) and serves; the bound port. grpc reports
        bind and certificate problems as RuntimeError."""
        s, server = self.settings, self._server
        assert server is not None, "start() after stop()"
        address = f"{s.host}:{s.port}"
        if s.tls_cert is not None and s.tls_key is not None:
            credentials = grpc.ssl_server_credentials([(s.tls_key.read_bytes(), s.tls_cert.read_bytes())])
            self.port = server.add_secure_port(address, credentials)
        else:
            self.port = server.add_insecure_port(address)
        await server.start()
        if self._evictor is not None:
            self._evictor.start(self.port)
        return self.port

    async def stop(self, grace: float | None) -> None:
        """Stops serving; calls still running get `grace` seconds (None: cancelled now)."""
        if self._evictor is not None:
            await self._evictor.stop()
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
