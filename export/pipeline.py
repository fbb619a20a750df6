"""Checkpoint directory -> parity-checked, atomically published model package (the library entry point): picks
the task's builder and runs the one export skeleton with it."""
from __future__ import annotations

from . import skeleton
from .config import ExportConfig
from .embed import EmbedBuilder
from .errors import ExportError
from .model_builder import ModelBuilder
from .seq2seq_builder import Seq2SeqBuilder, is_seq2seq_checkpoint
from .result import ExportResult


def export_checkpoint(cfg: ExportConfig) -> ExportResult:
    """Export, gate, publish. Raises ExportError (bad input) or ParityFailure; publishes nothing on either."""
    if cfg.matryoshka and cfg.task != "embed":
        raise ExportError(f"--matryoshka: declares an embedding model's vectors; the task is {cfg.task!r}, not embed")
    if cfg.task == "embed":
        builder = EmbedBuilder(cfg)
    elif cfg.task == "generate" and is_seq2seq_checkpoint(cfg.checkpoint):
        builder = Seq2SeqBuilder(cfg)
    else:
        builder = ModelBuilder(cfg)
    return skeleton.run(cfg, builder)
