"""Export stage: checkpoint directory -> versioned ONNX model package behind a parity gate.

    from export import ExportConfig, export_checkpoint
    result = export_checkpoint(ExportConfig(checkpoint=..., task="classify", repository=..., name="genre"))
"""
from .config import ExportConfig, GridConfig, Tolerances
from .errors import ExportError, ParityFailure


def export_checkpoint(cfg: ExportConfig):
    """Lazy import: `import export` stays cheap (no torch) until an export actually runs."""
    from .pipeline import export_checkpoint as run

    return run(cfg)


__all__ = ["ExportConfig", "GridConfig", "Tolerances", "ExportError", "ParityFailure", "export_checkpoint"]
