"""Publishing a checkpoint as a new package version, unless the latest version already holds it."""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Sequence

from modelpkg import MANIFEST_FILE, Manifest, ManifestError, existing_versions, sha256_file

from .errors import PipelineError
from .steps import run_command

log = logging.getLogger("ortserve.pipeline")


def latest_source(repository: Path, name: str) -> tuple[int, str | None]:
    """(latest version, sha256 of the checkpoint weights it was exported from); (0, None) when none."""
    version, manifest = _latest(repository, name)
    return version, None if manifest is None else manifest.source.get("checkpoint_sha256")


def _latest(repository: Path, name: str) -> tuple[int, Manifest | None]:
    versions = existing_versions(repository / name)
    if not versions:
        return 0, None
    try:
        return versions[-1], Manifest.from_json((repository / name / str(versions[-1]) / MANIFEST_FILE).read_text())
    except (OSError, ManifestError):  # unreadable: treated as not holding this checkpoint, so it is exported again
        return versions[-1], None


def publish(repository: Path, name: str, task: str, checkpoint: Path, variants: str,
            options: Sequence[str] = (), log_file: Path | None = None) -> int | None:
    """Exports (parity gate included) and publishes; the new version, or None when already published. `options`:
    more `python -m export` flags (--matryoshka); `log_file`: the export's output goes there too."""
    latest, manifest = _latest(repository, name)
    source = None if manifest is None else manifest.source.get("checkpoint_sha256")
    # The same weights with another Matryoshka declaration than asked make a new version too.
    same_options = manifest is None or manifest.matryoshka == ("--matryoshka" in options)
    if source is not None and same_options and source == sha256_file(checkpoint / "model.safetensors"):
        log.info("publish %s: version %d already holds this checkpoint", name, latest)
        return None
    cmd = [sys.executable, "-m", "export", str(checkpoint), "--task", task, "--repository", str(repository),
           "--name", name, "--variants", variants, *options]
    run_command(cmd, f"export+validate+publish {name}", log_file)
    new, _ = latest_source(repository, name)
    if new <= latest:
        raise PipelineError(f"export of {name} succeeded but published no new version")
    return new
