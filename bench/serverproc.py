"""Server processes for the benchmarks: ortserve (`python -m server`, through testing/launch.py) and the
MLServer peer.

Both run as real processes on free localhost ports; their output is collected by a thread (so a full
pipe never blocks them) and shown when they fail to start.
"""
from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from testing import launch
from testing.launch import free_port  # noqa: F401  (re-exported for bench.peer)

ROOT = Path(__file__).resolve().parents[1]


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


class ServerProcess(launch.ServerProcess):
    """ortserve for the benchmarks: the shared launcher (testing/launch.py), with the bench's longer start-up."""

    def __init__(self, repository: Path, extra_args: Sequence[str] = (), startup_timeout: float = 120.0,
                 profile_to: Path | None = None) -> None:
        super().__init__(repository, extra_args, startup_timeout=startup_timeout, profile_to=profile_to)
