"""The one launcher of server processes (testing/launch.py) with real child processes: waiting on a line, the
start-up failure report, and the process-group stop that the peers' servers (which fork workers) need."""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from testing.launch import ChildProcess, ServerStartError

# A child that starts a grandchild (like MLServer's workers), says so, then waits.
PARENT = ("import subprocess, sys, time; g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
          "print('warming up'); print(f'ready grandchild={g.pid}', flush=True); time.sleep(120)")


def alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def gone_within(pid: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_stop_ends_the_whole_process_group() -> None:
    child = ChildProcess([sys.executable, "-c", PARENT])
    try:
        grandchild = int(child.wait_for_line(re.compile(r"ready grandchild=(\d+)"), 60).group(1))
        assert child.lines[0] == "warming up\n" and alive(grandchild)
    finally:
        code = child.stop(timeout=10)
    assert code != 0 and gone_within(grandchild, 10)


def test_a_line_never_printed_kills_the_child_and_reports_its_output() -> None:
    child = ChildProcess([sys.executable, "-c", "print('booting', flush=True); import time; time.sleep(120)"])
    started = time.monotonic()
    with pytest.raises(ServerStartError, match=r"did not report 'serving'; its output:\nbooting"):
        child.wait_for_line(re.compile("never printed"), 2, "'serving'")
    assert time.monotonic() - started < 30 and child.proc.poll() is not None


def test_a_child_that_exits_early_fails_at_once() -> None:
    child = ChildProcess([sys.executable, "-c", "raise SystemExit('bad flag --x')"], own_group=False)
    started = time.monotonic()
    with pytest.raises(ServerStartError, match="bad flag --x"):
        child.wait_for_line(re.compile("listening"), 60)
    assert time.monotonic() - started < 30 and child.proc.returncode == 1
