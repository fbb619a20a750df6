"""Server processes for the benchmarks: ortserve (`python -m server`) and the MLServer peer.

Both run as real processes on free localhost ports; their output is collected by a thread (so a full
pipe never blocks them) and shown when they fail to start.
"""
from __future__ import annotations

import os
import queue
import re
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
_READY = re.compile(r"ready: (\d+) model version")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    """A child process whose combined output is kept in `lines`."""

    def __init__(self, cmd: Sequence[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> None:
        self.cmd = list(cmd)
        self.proc = subprocess.Popen(self.cmd, cwd=cwd, env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                     start_new_session=True)
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            self._queue.put(line)
        self._queue.put(None)

    def wait_for_line(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if line is None:
                break
            m = pattern.search(line)
            if m:
                return m
        self.stop()
        raise RuntimeError(f"{self.cmd[0]} did not start ({pattern.pattern!r} not seen); last output:\n"
                           + "".join(self.lines[-30:]))

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM to the process group (MLServer forks workers), SIGKILL after `timeout`."""
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=15)


class ServerProcess(Process):
    """`python -m server --repository DIR --port 0`; the port comes from its 'listening on' log line, and
    requests wait for its 'ready' line (models load after the port opens).

    profile_to: run it under cProfile (`python -m cProfile -o FILE -m server ...`); the statistics are
    written when the server exits after SIGTERM."""

    def __init__(self, repository: Path, extra_args: Sequence[str] = (), startup_timeout: float = 120.0,
                 profile_to: Path | None = None) -> None:
        prefix = [sys.executable] + (["-m", "cProfile", "-o", str(profile_to)] if profile_to else [])
        super().__init__([*prefix, "-m", "server", "--repository", str(repository), "--port", "0",
                          "--metrics-port", "-1", "--poll-interval", "0", "--grace-period", "1", *extra_args])
        m = self.wait_for_line(_LISTENING, startup_timeout)
        self.host, self.port = m.group(1), int(m.group(2))
        ready = self.wait_for_line(_READY, startup_timeout)
        if int(ready.group(1)) == 0:
            self.stop()
            raise RuntimeError("server started with no model SERVING; its output:\n" + "".join(self.lines[-30:]))

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
