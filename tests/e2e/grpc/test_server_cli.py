"""`python -m server` with bad flags or settings: exit 2 with ONE line on stderr naming the flag, no traceback."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.server_process import ROOT


@pytest.mark.parametrize("args, flag", [
    (["--port", "abc"], "--port"),
    (["--repository", "/definitely/not/here"], "--repository"),
    (["--tls-cert", "cert.pem"], "--tls-cert"),
    (["--tls-cert", __file__, "--tls-key", __file__], "--tls-cert"),
    (["--providers", "NoSuchExecutionProvider"], "--providers"),
])
def test_cli_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], flag: str) -> None:
    if "--repository" not in args:
        args = ["--repository", str(tmp_path), *args]
    done = subprocess.run([sys.executable, "-m", "server", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and "Traceback" not in done.stderr, done.stderr
