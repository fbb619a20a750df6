"""What the pipeline tells a running server while it builds: each model's stage in its repository folder
(modelpkg.building), and the training progress read from the trainer's own step log."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from modelpkg import Building, clear_building, write_building

log = logging.getLogger("ortserve.pipeline")


def training_progress(out: Path) -> float | None:
    """Steps done / steps of the run writing `out` (the trainer's work folder beside it holds training_args.json and
    metrics.jsonl); None before the first step or when there is no such run."""
    runs = sorted(out.parent.glob(f".tmp-{out.name}-*"), key=lambda p: p.stat().st_mtime if p.exists() else 0)
    if not runs:
        return None
    try:
        total = json.loads((runs[-1] / "training_args.json").read_text())["train"]["steps"]
        with open(runs[-1] / "metrics.jsonl", "rb") as f:
            lines = f.read().splitlines()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for line in reversed(lines):
        try:
            step = json.loads(line).get("step")
        except ValueError:
            continue              # the line being written
        if isinstance(step, int) and total:
            return min(1.0, step / total)
    return None


class BuildBoard:
    """The stage of every model the pipeline builds, as the server reads it (`<repository>/<name>/.building.json`)."""

    def __init__(self, repository: Path, logs: Path) -> None:
        self.repository = repository
        self.logs = logs

    def log_of(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def set(self, name: str, task: str, stage: str, progress: float | None = None, error: str | None = None) -> None:
        try:
            write_building(self.repository / name, Building(task=task, stage=stage, progress=progress,
                                                            log=str(self.log_of(name)), error=error))
        except OSError as exc:   # the repository is the server's: a status that cannot be written is not fatal
            log.warning("cannot write the build status of %s: %s", name, exc)

    def done(self, name: str) -> None:
        clear_building(self.repository / name)
