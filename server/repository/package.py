"""Reading and verifying one model package (docs/model-package.md) with the shared contract (modelpkg/).

Verification = manifest present and well-formed, parity.json present and passed, every file listed in
parity.json `files` hashing to the recorded sha256 (every file the server reads must be listed:
server/repository/served_files.py says which), and every file
the server reads resolving inside the version directory (a symlink to a file elsewhere is refused: the
repository is what was published and verified, not whatever a link points at).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelpkg import MANIFEST_FILE, PARITY_FILE, Manifest, ManifestError, sha256_file


class PackageError(Exception):
    """The package cannot be served; the message is the reason shown in ModelInfo / metadata / logs."""


@dataclass(frozen=True)
class Package:
    path: Path
    name: str
    version: int
    manifest: Manifest
    manifest_text: str
    parity: dict[str, Any]

    @property
    def task(self) -> str:
        return self.manifest.task

    def file(self, relative: str) -> Path:
        return self.path / relative


def check_inside(path: Path, root: Path) -> None:
    """PackageError unless `path` (after following symlinks) lies inside `root` (after following them)."""
    try:
        real, base = path.resolve(strict=True), root.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, a loop: the callers report missing files themselves
        return
    if not real.is_relative_to(base):
        raise PackageError(f"{path.name} resolves outside the version directory (a symlink); "
                           "a package's files must be inside it")


def _read_json(path: Path) -> tuple[dict[str, Any], str]:
    if not path.is_file():
        raise PackageError(f"{path.name} missing")
    check_inside(path, path.parent)
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PackageError(f"{path.name} unreadable: {exc}") from None
    if not isinstance(data, dict):
        raise PackageError(f"{path.name} is not a JSON object")
    return data, text


def read_package(path: Path, name: str, version: int) -> Package:
    """Reads and checks the manifest and parity report (no hashing: see verify_files)."""
    data, text = _read_json(path / MANIFEST_FILE)
    try:
        manifest = Manifest.from_dict(data)
    except ManifestError as exc:
        raise PackageError(str(exc)) from None
    parity, _ = _read_json(path / PARITY_FILE)
    if parity.get("passed") is not True:
        raise PackageError("parity.json: the parity gate did not pass")
    files = parity.get("files")
    if not isinstance(files, dict) or not files:
        raise PackageError("parity.json: files (name -> sha256) missing")
    return Package(path=path, name=name, version=version, manifest=manifest, manifest_text=text, parity=parity)


def verify_files(package: Package, required: list[str]) -> None:
    """Recomputes the sha256 of every file listed in parity.json; every `required` file (the ones the server opens:
    server/repository/served_files.py) must be listed, and is refused by name when it is not."""
    files: dict[str, Any] = package.parity["files"]
    for needed in required:
        if needed not in files:
            raise PackageError(f"{needed} is not listed in parity.json files (every file the server reads must be, "
                               "with its sha256)")
    for relative, expected in sorted(files.items()):
        if not isinstance(expected, str) or "/" in relative or "\\" in relative or relative in ("", ".", ".."):
            raise PackageError(f"parity.json: bad files entry {relative!r}")
        target = package.path / relative
        if not target.is_file():
            raise PackageError(f"{relative} listed in parity.json but missing")
        check_inside(target, package.path)
        actual = sha256_file(target)
        if actual != expected.lower():
            raise PackageError(f"sha256 mismatch for {relative}: parity.json says {expected[:12]}…, "
                               f"file is {actual[:12]}…")
