"""Model package layout: manifest (model.json), parity.json with file hashes, atomic publication."""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from modelpkg import FORMAT, NAME_PATTERN, Manifest, existing_versions, file_hashes, valid_name
from modelpkg import MANIFEST_FILE as MANIFEST
from modelpkg import PARITY_FILE as PARITY

from .errors import ExportError

log = logging.getLogger(__name__)

__all__ = ["FORMAT", "MANIFEST", "PARITY", "choose_version", "default_variants", "discard", "existing_versions",
           "publish_package",
           "file_hashes", "publish", "staging_dir", "utc_now", "validate_name", "write_json"]


def validate_name(name: str) -> str:
    """Package names become one directory level: no separators, no dot-dirs, no traversal."""
    if not valid_name(name or ""):
        raise ExportError(f"--name: {name!r} must match {NAME_PATTERN} (one directory level, no '/' or '..')")
    return name


def choose_version(name_dir: Path, requested: int | None) -> int:
    if requested is None:
        return max(existing_versions(name_dir), default=0) + 1
    if requested < 1:
        raise ExportError(f"--version: must be a positive integer, got {requested}")
    if (name_dir / str(requested)).exists():
        raise ExportError(f"--version: {name_dir / str(requested)} already exists (published versions are immutable)")
    return requested


def staging_dir(name_dir: Path) -> Path:
    """A private temp dir inside <repo>/<name>/: same filesystem, so the final rename is atomic."""
    name_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=name_dir))
    os.chmod(staging, 0o755)  # mkdtemp makes it private; a published version must be readable by the server
    return staging


def discard(staging: Path, name_dir: Path, created_name_dir: bool) -> None:
    shutil.rmtree(staging, ignore_errors=True)
    if created_name_dir:
        try:
            name_dir.rmdir()  # only if nothing else appeared there meanwhile
        except OSError:
            pass


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def default_variants(variants: dict[str, str], parity: dict[str, Any]) -> dict[str, str]:
    """CPU: for an in-place decoder with weight-quantized variants, the fastest of fp32 / w8 / w4 (an encoder-decoder's
    int8 too) that passed by the decode steps timed at export (export/speed.py); else int8 > optimized > fp32.
    CUDA: fp16 only when its parity actually passed, else optimized > fp32."""
    from .speed import AUTO_DEFAULT, pick_fastest

    ok = {v for v in variants if parity.get(v, {}).get("passed") is True}
    timed = {v: parity[v]["step_ms"] for v in ok & set(AUTO_DEFAULT) if parity[v].get("step_ms")}
    cpu = pick_fastest(timed) if len(timed) > 1 and timed.keys() == ok & set(AUTO_DEFAULT) else \
        next(v for v in ("int8", "optimized", "fp32") if v in ok)
    cuda = next(v for v in ("fp16", "optimized", "fp32") if v in ok)
    return {"cpu": cpu, "cuda": cuda}


def publish(staging: Path, name_dir: Path, version: int, auto: bool, finalize) -> int:
    """Rename the staged package to <name_dir>/<version>. `finalize(version)` writes model.json and
    parity.json for that version just before the rename. With an automatic version a concurrent
    publisher that took the number first makes us move to the next one."""
    for _ in range(100):
        target = name_dir / str(version)
        if not target.exists():
            finalize(version)
            try:
                os.rename(staging, target)  # fails if target appeared and is non-empty
                log.info("published %s", target)
                return version
            except OSError:
                if not auto:
                    raise
        elif not auto:
            raise ExportError(f"--version: {target} already exists (published versions are immutable)")
        version += 1
    raise ExportError(f"--version: could not find a free version under {name_dir}")


def publish_package(staging: Path, name_dir: Path, version: int, auto: bool, manifest: Manifest,
                    report: dict) -> int:
    """publish() with the usual last step: model.json with its version, then parity.json hashing every file."""
    def finalize(v: int) -> None:
        write_json(staging / MANIFEST, dataclasses.replace(manifest, version=v).to_dict())
        write_json(staging / PARITY, {**report, "files": file_hashes(staging)})

    return publish(staging, name_dir, version, auto, finalize)
