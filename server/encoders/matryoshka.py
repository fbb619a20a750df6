"""`dimensions` of an embedding request (OpenAI's parameter): Matryoshka shortening.

A Matryoshka-trained model's leading values make a shorter embedding of their own; its package declares it
(model.json `embedding.matryoshka`, set by `python -m export --matryoshka`). For such a model a request may ask for
1..size values: each vector is cut to them and, when the model's vectors are normalized, renormalised to unit
length (a cut unit vector is shorter than 1). Any other model answers its full size only: `dimensions` equal to
it is accepted, any other value refused naming `dimensions`, before anything is computed.
"""
from __future__ import annotations

import numpy as np

from server.protocol.errors import ServingError


def check_dimensions(name: str, size: int | None, asked: int | None, matryoshka: bool) -> None:
    """INVALID_ARGUMENT naming `dimensions` for a length this model cannot answer (size None: the graph leaves
    it open, checked again on the computed vectors)."""
    if asked is None:
        return
    if isinstance(asked, bool) or asked < 1:
        raise ServingError.invalid("dimensions", f"must be >= 1, got {asked}")
    if size is None:
        return
    if asked > size:
        raise ServingError.invalid("dimensions", f"{name!r} answers {size}-dimensional vectors; {asked} is more")
    if asked != size and not matryoshka:
        raise ServingError.invalid("dimensions", f"{name!r} answers {size}-dimensional vectors and its package "
                                                 "declares no Matryoshka shortening (export --matryoshka); got "
                                                 f"{asked}")


def shorten(vectors: np.ndarray, asked: int | None, renormalize: bool) -> np.ndarray:
    """The first `asked` values of each row, renormalised to unit L2 norm when `renormalize` (zero rows stay)."""
    if asked is None or asked == vectors.shape[1]:
        return vectors
    cut = np.array(vectors[:, :asked], dtype=np.float32)
    if renormalize:
        norms = np.linalg.norm(cut.astype(np.float64), axis=1, keepdims=True)
        cut = (cut / np.where(norms > 0, norms, 1.0)).astype(np.float32)
    return cut


__all__ = ["check_dimensions", "shorten"]
