"""The export-and-deploy pipeline: text corpus -> trained checkpoints -> parity-checked packages -> live models.

A stage package of its own (`python -m pipeline`): it drives each stage through its command line
(`python -m training ...`, `python -m export ...`), reads only the package contract (modelpkg/), and
asks a running server to load new versions through the client library's channel (TLS, bearer token).

    pipeline.steps     up-to-date stamps of the training steps
    pipeline.publish   export + publish a checkpoint unless the latest version already holds it
    pipeline.server    RepositoryModelLoad on a running server
    pipeline.run       the whole chain (Pipeline, PipelineConfig)
    pipeline.cli       command line
"""
from __future__ import annotations

from .errors import PipelineError
from .run import Pipeline, PipelineConfig

__all__ = ["Pipeline", "PipelineConfig", "PipelineError"]
