"""Steps that are skipped when their output is up to date.

Every output directory gets a `.ortserve-step.json` stamp holding a digest of the step's command and of its
inputs (files or directory trees, names and contents); a step runs again when that digest changes.
"""
from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import time
from pathlib import Path

from .errors import PipelineError

log = logging.getLogger("ortserve.pipeline")

STAMP = ".ortserve-step.json"


def digest_path(path: Path) -> str:
    """Digest of a file or a directory tree (relative names + contents), ignoring our own stamps."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and p.name != STAMP)
    for f in files:
        h.update(str(f.relative_to(path.parent if path.is_file() else path)).encode())
        with open(f, "rb") as stream:  # contents streamed into one digest: the stamps of earlier runs stay valid
            for block in iter(lambda: stream.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def step_key(cmd: list[str], inputs: list[Path], salt: str = "") -> str:
    """salt: what else the output depends on (a training step: its command's recipe digest)."""
    h = hashlib.sha256(json.dumps(cmd).encode())
    if salt:
        h.update(salt.encode())
    for p in inputs:
        h.update(digest_path(p).encode() if p.exists() else b"missing")
    return h.hexdigest()


def up_to_date(out: Path, key: str) -> bool:
    try:
        return json.loads((out / STAMP).read_text())["key"] == key
    except (OSError, ValueError, KeyError):
        return False


def stamp(out: Path, key: str, step: str) -> None:
    (out / STAMP).write_text(json.dumps({"key": key, "step": step, "at": time.time()}))


def run_command(cmd: list[str], what: str) -> None:
    """Runs one stage's command line; PipelineError when it exits non-zero."""
    log.info("%s: %s", what, " ".join(cmd))
    started = time.monotonic()
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise PipelineError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}")
    log.info("%s: done in %.1f s", what, time.monotonic() - started)
