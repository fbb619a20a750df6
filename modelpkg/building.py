"""A model still being built: `<repo>/<name>/.building.json`, written by the deploy pipeline while it trains and exports
the model, read by the server's repository poll so that the name is listed with its stage and a request to it is told
what is happening (UNAVAILABLE naming the stage) instead of NOT_FOUND. A dotfile: never a version, never hashed.

    {"task": "classify", "stage": "training", "progress": 0.42, "log": "artifacts/logs/genre.log",
     "error": null, "updated": 1764800000.0}

stage: queued | training | exporting (export with its parity gate) | failed (then `error` says which step and why).
progress: the share of the stage done, when one is known (training steps), else null.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

BUILDING_FILE = ".building.json"
STAGES = ("queued", "training", "exporting", "failed")


@dataclass(frozen=True)
class Building:
    task: str
    stage: str
    progress: float | None = None
    log: str = ""
    error: str | None = None
    updated: float = 0.0

    def describe(self) -> str:
        """One line for a status reason or an error: 'training 42% (log: ...)'."""
        what = self.stage if self.progress is None else f"{self.stage} {self.progress:.0%}"
        if self.error:
            what = f"{what}: {self.error}"
        return f"{what} (log: {self.log})" if self.log and self.log not in what else what


def write_building(name_dir: Path, status: Building) -> None:
    """Written whole or not at all (temp, then rename): a reader never sees half a file."""
    name_dir.mkdir(parents=True, exist_ok=True)
    tmp = name_dir / f"{BUILDING_FILE}.tmp"
    tmp.write_text(json.dumps({**asdict(status), "updated": time.time()}))
    os.replace(tmp, name_dir / BUILDING_FILE)


def read_building(name_dir: Path) -> Building | None:
    """The name's build status; None when there is none or it cannot be read (a model is then just unknown)."""
    try:
        data = json.loads((name_dir / BUILDING_FILE).read_text())
        progress = data.get("progress")
        return Building(task=str(data["task"]), stage=str(data["stage"]),
                        progress=float(progress) if isinstance(progress, (int, float)) else None,
                        log=str(data.get("log") or ""), error=data.get("error") or None,
                        updated=float(data.get("updated") or 0.0))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def clear_building(name_dir: Path) -> None:
    (name_dir / BUILDING_FILE).unlink(missing_ok=True)
