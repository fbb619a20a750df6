"""The one export skeleton: stage -> build -> gate -> publish. Each task plugs its builder in (export/builder.py
for the encoder and decoder tasks, export/embed.py for embeddings); the skeleton owns the staging directory, the
tokenizer check, parity.json, the refusal and the atomic publication of model.json (a typed modelpkg.Manifest)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from modelpkg import Manifest, ManifestError

from . import package
from .config import ExportConfig
from .errors import ExportError, ParityFailure
from .heldout import BUILTIN_TEXTS
from .report import parity_report
from .result import ExportResult
from .tokenizer_check import TokenizerReport, check_tokenizer, check_vocabulary
from .variants import VariantBuild


@dataclass
class Built:
    """What a builder wrote into the staging directory."""

    manifest: Manifest                  # version-less; default_variant as the builder knows it
    builds: dict[str, VariantBuild]     # variant -> its graph file and build notes
    removed: list[str]                  # tokenizer parts dropped for serving (the tokenizer check is told)
    export_s: float
    mask_token: str | None = None       # the tokenizer check tries it (fill-mask)


@dataclass
class Gated:
    passed: bool
    results: dict[str, Any]             # variant -> a result with as_json() (parity.json's `variants`)
    gate_s: float


class Builder(Protocol):
    checkpoint: Path                    # the checkpoint directory (its tokenizer is the reference)

    def load(self) -> None: ...
    def build(self, staging: Path) -> Built: ...
    def gate(self, built: Built, staging: Path) -> Gated: ...
    def failure_text(self, gated: Gated, tok_report: TokenizerReport, report: dict[str, Any]) -> str: ...
    def finish(self, staging: Path, manifest: Manifest, report: dict[str, Any], gated: Gated) -> Manifest: ...
    def published(self, result: ExportResult) -> None: ...


def run(cfg: ExportConfig, builder: Builder) -> ExportResult:
    """Stage, build, gate, publish. Raises ExportError or ParityFailure; publishes nothing on either."""
    repo = Path(cfg.repository)
    if repo.exists() and not repo.is_dir():
        raise ExportError(f"--repository: {repo} is not a directory")
    name_dir = repo / cfg.name
    version = package.choose_version(name_dir, cfg.version)
    builder.load()
    created = not name_dir.exists()
    staging = package.staging_dir(name_dir)
    try:
        built = builder.build(staging)
        check_vocabulary(staging, built.manifest.vocab_size)
        tok_report = check_tokenizer(builder.checkpoint, staging, list(BUILTIN_TEXTS), built.mask_token,
                                     built.manifest.max_length, built.removed)
        gated = builder.gate(built, staging)
        passed = gated.passed and tok_report.passed
        report = parity_report(passed, gated.results, built.builds, tok_report, built.export_s, gated.gate_s)
        if not passed:
            raise ParityFailure(f"parity gate failed for {cfg.name}; nothing published\n"
                                + builder.failure_text(gated, tok_report, report), report)
        manifest = checked(builder.finish(staging, built.manifest, report, gated))
        version = package.publish_package(staging, name_dir, version, cfg.version is None, manifest, report)
    except BaseException:
        package.discard(staging, name_dir, created)
        raise
    final = name_dir / str(version)
    result = ExportResult(final, version, json.loads((final / package.PARITY).read_text()))
    builder.published(result)
    return result


def checked(manifest: Manifest) -> Manifest:
    """The manifest as the server will read it: a builder's slip is an export error, never a package the server
    refuses."""
    try:
        Manifest.from_dict({**manifest.to_dict(), "version": 1})
    except ManifestError as exc:
        raise ExportError(f"export: built an invalid manifest ({exc})") from None
    return manifest
