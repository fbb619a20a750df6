"""A sequence classifier's scores: its logits under the package's recorded activation, or the one a request asks for.

The export records the head's activation in model.json `head.function_to_apply` (export/head_activation.py):
"softmax" over labels, "sigmoid" per label (multi-label heads, one-label cross-encoders), "none" (regression: the
logits). A request may name another by transformers' pipeline names (`function_to_apply`). Packages made before
the field keep what the server did then: classify softmax, a one-label cross-encoder's relevance sigmoid.
"""
from __future__ import annotations

import numpy as np

from modelpkg import Manifest
from server.protocol.errors import ServingError

ACTIVATIONS = ("softmax", "sigmoid", "none")


def check_function(value: str | None, field: str = "function_to_apply") -> str | None:
    """A request's function_to_apply (None or "" = the package's); INVALID_ARGUMENT naming `field` otherwise."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or value not in ACTIVATIONS:
        shown = value[:40] if isinstance(value, str) else value
        raise ServingError.invalid(field, f"must be one of {', '.join(ACTIVATIONS)}, got {shown!r}")
    return value


def recorded(manifest: Manifest, default: str) -> str:
    """The activation model.json records for the head; `default` for a package made before the field."""
    head = manifest.extra.get("head")
    value = head.get("function_to_apply") if isinstance(head, dict) else None
    return value if value in ACTIVATIONS else default


def check_recorded(manifest: Manifest) -> None:
    """At load: a `head.function_to_apply` the server does not know is a package error, not a silent softmax."""
    head = manifest.extra.get("head")
    if head is None:
        return
    value = head.get("function_to_apply") if isinstance(head, dict) else head
    if value not in ACTIVATIONS:
        raise ValueError(f"model.json: head.function_to_apply {value!r} is not one of {', '.join(ACTIVATIONS)}")


def apply(logits: np.ndarray, function: str) -> np.ndarray:
    """Scores of logits [..., labels] in float64 (the answer's floats are rounded once, at the end)."""
    x = np.asarray(logits, dtype=np.float64)
    if function == "softmax":
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    if function == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    return x


__all__ = ["ACTIVATIONS", "apply", "check_function", "check_recorded", "recorded"]
