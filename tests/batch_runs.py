"""Helpers of the tests that run the batch script as a real process."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path


def wait_for_lines(proc: subprocess.Popen, output: Path, lines: int, timeout: float = 60) -> None:
    """Until `output` holds at least `lines` lines, the process ends, or `timeout` seconds pass (the caller then
    checks which: a run that ended first was not cut mid-way)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if output.exists() and output.read_bytes().count(b"\n") >= lines:
            return
        time.sleep(0.005)
