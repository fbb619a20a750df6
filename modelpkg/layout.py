"""A model repository's layout: `<repo>/<name>/<version>/`, the file names of a package, and the ONE rule
for names and versions that the exporter, the deploy pipeline and the server all apply.

Version rule: a version directory is named by a positive integer written canonically — digits, no leading
zero, at most 18 digits (`1`, `12`; never `007`, `0`, `+3`, `²`). Any other directory is not a version: the
server does not load it and the exporter does not count it when choosing the next number.
"""
from __future__ import annotations

import re
from pathlib import Path

FORMAT = "ortserve.model-package/1"
MANIFEST_FILE = "model.json"
PARITY_FILE = "parity.json"
TOKENIZER_FILE = "tokenizer.json"
TASKS = ("classify", "fill-mask", "generate", "embed", "token-classify")

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"
_NAME_RE = re.compile(NAME_PATTERN)
_VERSION_RE = re.compile(r"[1-9][0-9]{0,17}")


def valid_name(name: str) -> bool:
    """A model name is one directory level: letters, digits, '_', '.', '-', 1-128 characters, no '..'."""
    return _NAME_RE.fullmatch(name) is not None and name not in (".", "..")


def parse_version(text: str) -> int | None:
    """'3' -> 3; anything that is not a canonical positive integer ('007', '0', '-1', 'v2') -> None."""
    return int(text) if _VERSION_RE.fullmatch(text) else None


def existing_versions(name_dir: Path) -> list[int]:
    """Sorted versions under a model directory (directories whose names pass parse_version); [] if none."""
    if not name_dir.is_dir():
        return []
    found = (parse_version(p.name) for p in name_dir.iterdir() if p.is_dir())
    return sorted(v for v in found if v is not None)
