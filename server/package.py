"""Reading and verifying one model package (docs/model-package.md): the only format the server reads.

Verification = manifest present and well-formed, parity.json present and passed, and every file listed
in parity.json `files` hashing to the recorded sha256 (files the server reads must be listed).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGE_FORMAT = "ortserve.model-package/1"
TASKS = ("classify", "fill-mask", "generate")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
VERSION_RE = re.compile(r"[1-9][0-9]{0,17}")
_CHUNK = 1 << 20


class PackageError(Exception):
    """The package cannot be served; the message is the reason shown in ModelInfo / metadata / logs."""


def valid_name(name: str) -> bool:
    return NAME_RE.fullmatch(name) is not None


def parse_version(text: str) -> int | None:
    """'3' -> 3; anything that is not a positive integer -> None."""
    return int(text) if VERSION_RE.fullmatch(text) else None


@dataclass(frozen=True)
class Package:
    path: Path
    name: str
    version: int
    manifest: dict[str, Any]
    manifest_text: str
    parity: dict[str, Any]

    @property
    def task(self) -> str:
        return self.manifest["task"]

    def file(self, relative: str) -> Path:
        return self.path / relative


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _read_json(path: Path) -> tuple[dict[str, Any], str]:
    if not path.is_file():
        raise PackageError(f"{path.name} missing")
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PackageError(f"{path.name} unreadable: {exc}") from None
    if not isinstance(data, dict):
        raise PackageError(f"{path.name} is not a JSON object")
    return data, text


def _check_manifest(m: dict[str, Any]) -> None:
    def need(key: str, kind: type | tuple[type, ...]) -> Any:
        if not isinstance(m.get(key), kind):
            raise PackageError(f"model.json: {key} missing or not a {getattr(kind, '__name__', kind)}")
        return m[key]

    if m.get("format") != PACKAGE_FORMAT:
        raise PackageError(f"model.json: format is {m.get('format')!r}, expected {PACKAGE_FORMAT!r}")
    task = need("task", str)
    if task not in TASKS:
        raise PackageError(f"model.json: task {task!r} is not one of {', '.join(TASKS)}")
    max_length = need("max_length", int)
    if max_length < 1:
        raise PackageError("model.json: max_length must be >= 1")
    for key in ("inputs", "outputs"):
        specs = need(key, list)
        if not specs or not all(isinstance(s, dict) and isinstance(s.get("name"), str)
                                and isinstance(s.get("dtype"), str) and isinstance(s.get("shape"), list)
                                for s in specs):
            raise PackageError(f"model.json: {key} must be a non-empty list of {{name, dtype, shape}}")
    variants = need("variants", dict)
    if not variants or not all(isinstance(v, str) and v and "/" not in v and v != ".." for v in variants.values()):
        raise PackageError("model.json: variants must map names to file names in the package")
    if task == "classify":
        labels = need("labels", list)
        if not labels or not all(isinstance(x, str) for x in labels):
            raise PackageError("model.json: labels must be a non-empty list of strings for classify")
    if task == "fill-mask":
        need("mask_token", str)
    if task == "generate":
        cache = need("cache", dict)
        for key in ("num_layers", "num_heads", "head_dim"):
            if not isinstance(cache.get(key), int) or cache[key] < 1:
                raise PackageError(f"model.json: cache.{key} must be a positive integer")


def read_package(path: Path, name: str, version: int) -> Package:
    """Reads and checks the manifest and parity report (no hashing: see verify_files)."""
    manifest, text = _read_json(path / "model.json")
    _check_manifest(manifest)
    parity, _ = _read_json(path / "parity.json")
    if parity.get("passed") is not True:
        raise PackageError("parity.json: the parity gate did not pass")
    files = parity.get("files")
    if not isinstance(files, dict) or not files:
        raise PackageError("parity.json: files (name -> sha256) missing")
    return Package(path=path, name=name, version=version, manifest=manifest, manifest_text=text, parity=parity)


def verify_files(package: Package, required: list[str]) -> None:
    """Recomputes the sha256 of every file listed in parity.json; every `required` file must be listed."""
    files: dict[str, Any] = package.parity["files"]
    for needed in required:
        if needed not in files:
            raise PackageError(f"parity.json: {needed} is not listed in files")
    for relative, expected in sorted(files.items()):
        if not isinstance(expected, str) or "/" in relative or "\\" in relative or relative in ("", ".", ".."):
            raise PackageError(f"parity.json: bad files entry {relative!r}")
        target = package.path / relative
        if not target.is_file():
            raise PackageError(f"{relative} listed in parity.json but missing")
        actual = sha256_file(target)
        if actual != expected.lower():
            raise PackageError(f"sha256 mismatch for {relative}: parity.json says {expected[:12]}…, "
                               f"file is {actual[:12]}…")
