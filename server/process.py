"""The server process: the gRPC front door (task API, KServe v2, health, reflection; server/grpc/), the HTTP
front door (KServe v2 REST, OpenAI-compatible API; server/http/) on the same event loop and data plane, and a
metrics endpoint.

Start-up order: bind and start gRPC (health answers NOT_SERVING meanwhile), then HTTP, start the metrics
endpoint, load the repository, then SERVING. SIGTERM / SIGINT: health NOT_SERVING and new work refused with
UNAVAILABLE (HTTP 503), admitted requests on either protocol finish within grace_period, then the process
exits 0.
"""
from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass
from server.dataplane import DataPlane
from server.runtime.fdlimit import connection_cap, raise_open_file_limit
from server.grpc.server import GrpcServer
from server.http.routes import build_app, build_metrics_app
from server.http.connections import ConnectionGate, ConnectionLimits
from server.http.serve import HttpServer
from server.runtime.metrics import Metrics
from server.runtime.settings import ServerSettings

log = logging.getLogger(__name__)


class StartupError(Exception):
    """The server cannot start with these settings (port in use, bad certificate, ...)."""


@dataclass
class Endpoints:
    grpc_port: int
    metrics_port: int | None
    http_port: int | None = None


class OrtServer:
    def __init__(self, settings: ServerSettings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.plane = DataPlane(settings, self.metrics)
        self._grpc: GrpcServer | None = None
        self._metrics_http: HttpServer | None = None
        self._http: HttpServer | None = None
        self.endpoints: Endpoints | None = None
        self._limits: ConnectionLimits | None = None
        self._gate: ConnectionGate | None = None   # the HTTP door's and the metrics port's connections together

    async def start(self) -> Endpoints:
        s = self.settings
        cap = connection_cap(s.max_connections, raise_open_file_limit())
        self._limits = ConnectionLimits(header_timeout=s.header_timeout, read_timeout=s.read_timeout,
                                        keep_alive_timeout=s.keep_alive_timeout, max_connections=cap)
        self._gate = ConnectionGate(cap)
        log.info("connections: at most %d per door; request heads within %gs, bodies without a byte for %gs at "
                 "most, idle keep-alive %gs, idle gRPC %gs", cap, s.header_timeout, s.read_timeout,
                 s.keep_alive_timeout, s.grpc_idle_timeout)
        server = GrpcServer(self.plane, s, max_connections=cap)
        try:
            port = await server.start()
        except Exception as exc:  # grpc reports bind and certificate problems as RuntimeError
            raise StartupError(f"--port: cannot serve on {s.host}:{s.port}: {exc}") from None
        self._grpc = server
        scheme = "TLS" if s.tls_cert else "plaintext"
        log.info("listening on %s:%d (%s)", s.host, port, scheme, extra={"port": port})
        http_port = None
        if s.http_port >= 0:
            http_port = await self._start_http(scheme)
        metrics_port = None
        if s.metrics_port >= 0:
            metrics_port = await self._start_metrics()
        self.endpoints = Endpoints(port, metrics_port, http_port)
        await self.plane.open(poll=True)
        log.info("ready: %d model version(s) SERVING",
                 sum(1 for m in self.plane.list_models() if m.state.value == "SERVING"))
        return self.endpoints

    async def _start_metrics(self) -> int:
        """The metrics port: on this event loop under the same connection limits as the HTTP door (it used to be a
        thread per connection, without a timeout), the same TLS and the same token rule."""
        s = self.settings
        metrics = HttpServer(build_metrics_app(self.plane, s.auth_token), s.host, s.metrics_port, s.tls_cert,
                             s.tls_key, grace=1.0, limits=self._limits, gate=self._gate)
        try:
            port = await metrics.start()
        except Exception as exc:  # bind (OSError) or TLS context (ssl.SSLError) problems
            await self._stop_servers()
            raise StartupError(f"--metrics-port: cannot serve on {s.host}:{s.metrics_port}: {exc}") from None
        self._metrics_http = metrics
        log.info("metrics on %s:%d", s.host, port, extra={"metrics_port": port})
        return port

    async def _start_http(self, scheme: str) -> int:
        s = self.settings
        app = build_app(self.plane, s.max_message_bytes, s.auth_token)
        http = HttpServer(app, s.host, s.http_port, s.tls_cert, s.tls_key, grace=1.0, limits=self._limits,
                          gate=self._gate)
        try:
            port = await http.start()
        except Exception as exc:  # bind (OSError) or TLS context (ssl.SSLError) problems
            await self._stop_servers()
            raise StartupError(f"--http-port: cannot serve on {s.host}:{s.http_port}: {exc}") from None
        self._http = http
        log.info("http listening on %s:%d (%s)", s.host, port, scheme, extra={"http_port": port})
        return port

    async def _stop_servers(self) -> None:
        if self._metrics_http is not None:
            await self._metrics_http.stop()
            self._metrics_http = None
        if self._http is not None:
            await self._http.stop()
            self._http = None
        if self._grpc is not None:
            await self._grpc.stop(None)
            self._grpc = None

    async def shutdown(self) -> None:
        """Drain: refuse new work, let admitted requests finish (up to grace_period), stop."""
        grace = self.settings.grace_period
        self.plane.begin_drain()
        log.info("draining: %d request(s) in flight, grace period %.1fs", self.plane.inflight, grace)
        if not await self.plane.wait_idle(grace):
            log.warning("grace period over with %d request(s) still running; cancelling them", self.plane.inflight)
        if self._http is not None:
            await self._http.stop()  # lets the last responses flush, closes idle keep-alive connections
        if self._grpc is not None:
            await self._grpc.stop(grace=1.0)  # lets the last responses flush
        await self.plane.close()
        if self._metrics_http is not None:
            await self._metrics_http.stop()
        log.info("stopped")

    async def run_until_signal(self) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        await stop.wait()
        log.info("signal received")
        await self.shutdown()
