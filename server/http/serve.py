"""uvicorn on the server's own event loop: bind (port 0 = a free one), TLS, graceful stop.

uvicorn's signal handling is switched off: the process's SIGTERM handler (server/process.py) drains the data
plane first, then stops this server, which lets open responses finish (up to `grace` seconds).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from pathlib import Path
from typing import Iterator

import uvicorn
from starlette.applications import Starlette

from server.http.connections import ConnectionGate, ConnectionLimits, guarded_protocol

log = logging.getLogger(__name__)


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves the process's signals alone."""

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29
        return

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # uvicorn >= 0.29
        yield


def _listening_socket(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket. proto must be IPPROTO_TCP (socket.create_server leaves it 0): asyncio turns
    Nagle off (TCP_NODELAY) only on sockets that say so, and with Nagle on every response waited for the client's
    delayed ACK (bench/FINDINGS.md)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


class HttpServer:
    def __init__(self, app: Starlette, host: str, port: int, tls_cert: Path | None = None,
                 tls_key: Path | None = None, grace: float = 1.0, limits: ConnectionLimits | None = None,
                 gate: ConnectionGate | None = None) -> None:
        """limits: the connection timeouts and cap (server/http/connections.py); gate: shared with the other
        server(s) whose connections count together (the HTTP door and the metrics port)."""
        self.host = host
        self.requested_port = port
        self.tls = tls_cert is not None
        limits = limits or ConnectionLimits()
        self.gate = gate or ConnectionGate(limits.max_connections)
        config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off", server_header=False,
                                ssl_certfile=str(tls_cert) if tls_cert else None,
                                ssl_keyfile=str(tls_key) if tls_key else None,
                                timeout_graceful_shutdown=max(grace, 0.1),
                                http=guarded_protocol(self.gate, limits),
                                timeout_keep_alive=limits.keep_alive_timeout)  # type: ignore[arg-type]
        self._server = _EmbeddedServer(config)
        self._task: asyncio.Task[None] | None = None
        self.port = 0
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)  # its "Started server process" lines

    async def start(self) -> int:
        """Binds and serves; the bound port (OSError when the address is taken)."""
        sock = _listening_socket(self.host, self.requested_port)
        self.port = sock.getsockname()[1]
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]), name="http-server")
        while not self._server.started:
            if self._task.done():
                sock.close()
                self._task.result()  # raises what stopped it
                raise OSError("the HTTP server stopped while starting")
            await asyncio.sleep(0.01)
        return self.port

    async def stop(self) -> None:
        """Closes the listener and idle connections; open responses get the grace period."""
        if self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
