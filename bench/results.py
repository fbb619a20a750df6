"""Result files: one JSON per piece, written atomically (temp file, then rename)."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .config import PIECES


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def load_results(out: Path) -> dict[str, dict[str, Any]]:
    """piece -> its result document, for every piece whose file exists in `out`."""
    found = {}
    for piece in PIECES:
        f = out / f"{piece}.json"
        if f.is_file():
            found[piece] = json.loads(f.read_text(encoding="utf-8"))
    return found
