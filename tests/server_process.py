"""A real server process on a free localhost port, for client / batch / replica tests.

Started exactly as an operator would (`python -m server --repository DIR --port 0`); the port is
read from the server's "listening on HOST:PORT" log line.
"""
from __future__ import annotations

import atexit
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_LISTENING = re.compile(r"listening on (\S+):(\d+)")
_METRICS = re.compile(r"metrics on (\S+):(\d+)")


class ServerProcess:
    def __init__(self, repository: Path, extra_args: Sequence[str] = (), port: int = 0,
                 startup_timeout: float = 60.0, root_cert: Path | None = None) -> None:
        self.repository = repository
        cmd = [sys.executable, "-m", "server", "--repository", str(repository), "--port", str(port),
               "--metrics-port", "-1", "--poll-interval", "0", "--grace-period", "1", *extra_args]
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, errors="replace")
        self.lines: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.host, self.port = self._wait_listening(startup_timeout)
        self._wait_serving(startup_timeout, root_cert)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def metric(self, name: str, **labels: str) -> float:
        """A sample of the Prometheus endpoint (start with extra_args ["--metrics-port", "0"]); 0 if absent."""
        import urllib.request

        found = [m for m in (_METRICS.search(line) for line in self.lines) if m]
        if not found:
            raise RuntimeError("the server has no metrics endpoint (pass --metrics-port 0)")
        url = f"http://{found[-1].group(1)}:{found[-1].group(2)}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        want = {f'{k}="{v}"' for k, v in labels.items()}
        for line in text.splitlines():
            head, _, value = line.rpartition(" ")
            if head.split("{")[0] == name and want <= set(head.partition("{")[2].rstrip("}").split(",")):
                return float(value)
        return 0.0

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def _wait_listening(self, timeout: float) -> tuple[str, int]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self._lines.get(timeout=0.2)
            except queue.Empty:
                continue
            if line is None:
                break
            match = _LISTENING.search(line)
            if match:
                return match.group(1), int(match.group(2))
        self.kill()
        raise RuntimeError("server did not report 'listening on HOST:PORT'; its output:\n" + "".join(self.lines))

    def _wait_serving(self, timeout: float, root_cert: Path | None) -> None:
        """The server listens before its models are loaded: wait until grpc.health.v1 says SERVING."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        if root_cert is None:
            channel = grpc.insecure_channel(self.address)
        else:
            channel = grpc.secure_channel(self.address, grpc.ssl_channel_credentials(root_cert.read_bytes()))
        end = time.monotonic() + timeout
        with channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < end and self.proc.poll() is None:
                try:
                    status = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2.0).status
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.05)
        self.kill()
        raise RuntimeError("server did not become SERVING; its output:\n" + "".join(self.lines))

    def kill(self) -> None:
        """SIGKILL: the replica vanishes mid-request, as in a crash."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port() -> int:
    """A port nobody listens on right now (for a server started later, or a refused connection)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_SHARED: dict[Path, ServerProcess] = {}


def shared_server(repository: Path) -> ServerProcess:
    """One server per repository for the whole pytest process, whichever test module asks first.

    (A session fixture defined here and imported by several modules would start one per module.)
    """
    server = _SHARED.get(repository)
    if server is None or server.proc.poll() is not None:
        server = _SHARED[repository] = ServerProcess(repository)
        atexit.register(server.stop)
    return server


def repository_with(source: Path, dest: Path, *names: str) -> Path:
    """A copy of some packages of a (read-only, shared) repository: a server that loads less starts faster."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copytree(source / name, dest / name)
    return dest
