"""What an export returns: the published package, its version and its parity report."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ExportResult:
    package_dir: Path
    version: int
    parity: dict[str, Any]
