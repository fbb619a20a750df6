"""The suite's levels: one folder under tests/ per level, whose name is the marker every test in it carries
(tests/conftest.py applies it; pyproject.toml registers it)."""
from __future__ import annotations

from pathlib import Path

LEVELS = ("unit", "e2e", "reliability", "training", "export", "pipeline", "harness")
TESTS = Path(__file__).resolve().parent


def level_of(path: Path) -> str | None:
    """The level of a path under tests/ (its first folder), or None outside the level folders."""
    try:
        first = path.resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return first if first in LEVELS else None
