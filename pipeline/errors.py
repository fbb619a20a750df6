"""The pipeline's one error type."""
from __future__ import annotations


class PipelineError(RuntimeError):
    """A step failed; the message is one readable line."""
