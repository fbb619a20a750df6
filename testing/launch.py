"""Start a server as a child process and wait until it serves: the one launcher that the tests, the benchmarks
and the soak script use, for ortserve (`ServerProcess`: `python -m server`) and for the peers' servers
(`start_peer`, or a `ChildProcess` subclass with `wait_ready`: MLServer, vLLM, llama-server, infinity-emb, Ray Serve).

The port is read from the server's "listening on HOST:PORT" log line (so `--port 0` works; the HTTP port,
when `--http-port` is given in extra_args, from "http listening on HOST:PORT"), then
grpc.health.v1 is polled until the server says SERVING (it listens before its models are loaded).
The child's output is pumped by a thread, so a full pipe never blocks it, and kept for failure reports.
"""
from __future__ import annotations

import contextlib
import os
import queue
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

ROOT = Path(__file__).resolve().parents[1]  # the repository root (python -m server runs there)
_LISTENING = re.compile(r"(?<!http )listening on (\S+):(\d+)")
_HTTP_LISTENING = re.compile(r"http listening on (\S+):(\d+)")
_METRICS = re.compile(r"metrics on (\S+):(\d+)")


class ServerStartError(RuntimeError):
    """A server did not start (or never became SERVING); the message ends with its last output."""


def free_port() -> int:
    """A port nobody listens on right now (for a server started later, or a refused connection)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Poll `condition` every 50 ms until it holds; AssertionError naming `what` after `timeout` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def prometheus_sample(text: str, name: str, **labels: str) -> float:
    """The value of the sample `name` whose labels include `labels`, in a Prometheus text exposition; 0 if absent."""
    want = {f'{k}="{v}"' for k, v in labels.items()}
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] == name and want <= set(head.partition("{")[2].rstrip("}").split(",")):
            return float(value)
    return 0.0


def _open_file_limit(n: int) -> Callable[[], None]:
    def apply() -> None:   # runs in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return apply


class ChildProcess:
    """A child process whose combined stdout and stderr a thread keeps in `lines`.

    own_group: the child leads a process group of its own, and stop() / kill() signal the whole group (servers
    that fork workers: MLServer, vLLM); else only the child is signalled, and a Ctrl-C of ours reaches it too.
    open_files: the child's open-file limit (soft and hard), to reach it with a few hundred connections.
    """

    def __init__(self, cmd: Sequence[str], env: Mapping[str, str] | None = None, cwd: Path = ROOT,
                 own_group: bool = True, open_files: int | None = None) -> None:
        self.cmd = list(cmd)
        self.own_group = own_group
        self.proc = subprocess.Popen(self.cmd, cwd=cwd, env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                     start_new_session=own_group,
                                     preexec_fn=None if open_files is None else _open_file_limit(open_files))
        self.lines: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self, last: int = 30) -> str:
        return "".join(self.lines[-last:])

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def wait_for_line(self, pattern: re.Pattern[str], timeout: float, what: str = "") -> re.Match[str]:
        """The first line not yet waited on that matches `pattern`. If the child exits or `timeout` passes
        first, it is killed and ServerStartError says so (`what`: the line expected, in words)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self._lines.get(timeout=0.2)
            except queue.Empty:
                continue
            if line is None:
                break
            match = pattern.search(line)
            if match:
                return match
        self.kill()
        raise ServerStartError(f"{Path(self.cmd[0]).name} did not report {what or repr(pattern.pattern)}; "
                               "its output:\n" + self.output(200))

    def wait_ready(self, probe: Callable[[], bool], timeout: float, what: str,
                   error: type[Exception] = ServerStartError) -> None:
        """Poll probe() (an exception counts as not yet) until it holds; if the child exits or `timeout` passes
        first, stop it and raise `error` naming `what` with its last output."""
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.proc.poll() is None:
            try:
                if probe():
                    return
            except Exception:  # noqa: BLE001 - not listening yet (each client library raises its own)
                pass
            time.sleep(0.2)
        self.stop()
        raise error(f"{what} did not become ready; its last output:\n" + self.output(40))

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):  # gone between poll() and here
            if self.own_group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: the process vanishes mid-request, as in a crash."""
        if self.proc.poll() is None:
            self._signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM (a server drains), then its exit code; SIGKILL and -9 after `timeout`."""
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def __enter__(self) -> "ChildProcess":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def http_ok(url: str) -> Callable[[], bool]:
    """A readiness probe: GET `url` answers 200."""
    def probe() -> bool:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    return probe


def start_peer(cmd: Sequence[str], what: str, *, line: re.Pattern[str] | None = None,
               ready: Callable[[], bool] | None = None, timeout: float = 300.0, env: Mapping[str, str] | None = None,
               cwd: Path = ROOT, error: type[Exception] = ServerStartError) -> ChildProcess:
    """A peer's server (vLLM, llama-server, infinity-emb, Ray Serve, ...) in a process group of its own, returned
    once it logged `line` (when given) and `ready()` holds (when given); else stopped, and `error` says why."""
    proc = ChildProcess(cmd, env=env, cwd=cwd)
    if line is not None:
        try:
            proc.wait_for_line(line, timeout, what)
        except ServerStartError as exc:
            if error is ServerStartError:
                raise
            raise error(str(exc)) from None
    if ready is not None:
        proc.wait_ready(ready, timeout, what, error)
    return proc


class ServerProcess(ChildProcess):
    """A real `python -m server` process on a loopback port.

    extra_args go after the defaults, so they override them (`--metrics-port 0` for a metrics endpoint).
    startup_timeout bounds each of the two waits (listening, then SERVING); a model build can be slow on a
    loaded machine. profile_to runs it under cProfile; the statistics are written when it exits after SIGTERM.
    """

    def __init__(self, repository: Path, extra_args: Sequence[str] = (), startup_timeout: float = 120.0, *,
                 port: int = 0, root_cert: Path | None = None, env: Mapping[str, str] | None = None,
                 profile_to: Path | None = None, root: Path = ROOT, open_files: int | None = None) -> None:
        """root: the source tree whose server runs (another checkout for an A/B run: bench/engine_ab.py);
        open_files: the server's open-file limit (soft and hard)."""
        self.repository = repository
        self.tls = root_cert is not None
        self.root_cert = root_cert
        # The bearer token it was started with: the metrics port needs it too (docs/protocol.md, Authentication).
        args = list(extra_args)
        self.token = next((args[i + 1] for i in range(len(args) - 1) if args[i] == "--auth-token"),
                          (env or {}).get("ORTSERVE_AUTH_TOKEN"))
        prefix = [sys.executable] + (["-m", "cProfile", "-o", str(profile_to)] if profile_to else [])
        cmd = [*prefix, "-m", "server", "--repository", str(repository), "--port", str(port),
               "--metrics-port", "-1", "--http-port", "-1", "--poll-interval", "0", "--grace-period", "1", *extra_args]
        if root != ROOT:
            env = {**(env or {}), "PYTHONPATH": str(root)}
        super().__init__(cmd, env=env, cwd=root, own_group=False, open_files=open_files)
        try:
            listening = self.wait_for_line(_LISTENING, startup_timeout, "'listening on HOST:PORT'")
            self.host, self.port = listening.group(1), int(listening.group(2))
            self._wait_serving(startup_timeout, root_cert)
        except ServerStartError:
            self.kill()
            raise

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def http_port(self) -> int:
        """The HTTP front door's port (start with extra_args ["--http-port", "0"])."""
        found = [m for m in (_HTTP_LISTENING.search(line) for line in self.lines) if m]
        if not found:
            raise RuntimeError("the server has no HTTP endpoint (pass --http-port 0)")
        return int(found[-1].group(2))

    @property
    def http_url(self) -> str:
        """http(s)://HOST:PORT of the HTTP front door."""
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        """http(s)://HOST:PORT/metrics of the metrics port (start with extra_args ["--metrics-port", "0"])."""
        found = [m for m in (_METRICS.search(line) for line in self.lines) if m]
        if not found:
            raise RuntimeError("the server has no metrics endpoint (pass --metrics-port 0)")
        return f"{'https' if self.tls else 'http'}://{found[-1].group(1)}:{found[-1].group(2)}/metrics"

    def metrics_text(self) -> str:
        """The metrics port's exposition, fetched with the server's token and certificate when it has them."""
        import ssl

        headers = {"authorization": f"Bearer {self.token}"} if self.token else {}
        context = ssl.create_default_context(cafile=str(self.root_cert)) if self.root_cert else None
        with urllib.request.urlopen(urllib.request.Request(self.metrics_url, headers=headers), timeout=10,
                                    context=context) as response:
            return response.read().decode()

    def metric(self, name: str, **labels: str) -> float:
        """A sample of the Prometheus endpoint (start with extra_args ["--metrics-port", "0"]); 0 if absent."""
        return prometheus_sample(self.metrics_text(), name, **labels)

    def _wait_serving(self, timeout: float, root_cert: Path | None) -> None:
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
        raise ServerStartError("server did not become SERVING; its output:\n" + self.output(200))

    def __enter__(self) -> "ServerProcess":
        return self
