"""sha256 of files: what parity.json `files` records and the server re-checks at load."""
from __future__ import annotations

import hashlib
from pathlib import Path

from .layout import PARITY_FILE

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_hashes(package: Path) -> dict[str, str]:
    """sha256 of every file of a package directory except parity.json itself (which holds these) and dotfiles."""
    return {p.name: sha256_file(p) for p in sorted(Path(package).iterdir())
            if p.is_file() and p.name != PARITY_FILE and not p.name.startswith(".")}
