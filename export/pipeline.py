"""Checkpoint directory -> parity-checked, atomically published model package (the library entry point): picks
the task's builder and runs the one export skeleton with it."""
from __future__ import annotations

from . import skeleton
from .config import ExportConfig
from .embed import EmbedBuilder
from .model_builder import ModelBuilder
from .result import ExportResult


def export_checkpoint(cfg: ExportConfig) -> ExportResult:
    """Export, gate, publish. Raises ExportError (bad input) or ParityFailure; publishes nothing on either."""
    builder = EmbedBuilder(cfg) if cfg.task == "embed" else ModelBuilder(cfg)
    return skeleton.run(cfg, builder)
