"""The suite's levels: one folder under tests/ per level, whose name is the marker every test in it carries
(tests/conftest.py applies it; pyproject.toml registers it), and which folders a `-m` expression can select at all,
so that `pytest -m unit` does not import the modules of the other levels only to deselect their tests."""
from __future__ import annotations

import itertools
import re
from pathlib import Path

LEVELS = ("unit", "e2e", "reliability", "training", "export", "pipeline", "harness")
TESTS = Path(__file__).resolve().parent
_NAME = re.compile(r"[A-Za-z_]\w*")
_OPERATORS = {"and", "or", "not"}
_MOST_FREE_NAMES = 8   # markers besides the levels an expression may name and still be decided here


def level_of(path: Path) -> str | None:
    """The level of a path under tests/ (its first folder), or None outside the level folders."""
    try:
        first = path.resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return first if first in LEVELS else None


def can_select(markexpr: str, level: str) -> bool:
    """Whether a test of `level` can match `markexpr`, whatever its other markers (slow, gpu, ...) are.

    Every test of a level carries that level's marker and no other level's. An expression this does not parse
    (marker arguments, odd names) or that names many other markers counts as able to select anything."""
    tokens = re.findall(r"[()]|[^\s()]+", markexpr)
    if not tokens or any(t not in "()" and not _NAME.fullmatch(t) for t in tokens):
        return True
    free = sorted({t for t in tokens if _NAME.fullmatch(t)} - _OPERATORS - set(LEVELS))
    if len(free) > _MOST_FREE_NAMES:
        return True
    code = " ".join(tokens)
    for values in itertools.product((False, True), repeat=len(free)):
        names = {**{name: name == level for name in LEVELS}, **dict(zip(free, values))}
        try:
            if eval(code, {"__builtins__": {}}, names):  # noqa: S307 (names and and/or/not only, checked above)
                return True
        except SyntaxError:
            return True
    return False
