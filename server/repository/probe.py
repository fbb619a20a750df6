"""A variant checked where it serves: the package's probe (export/probes.py) run through the variant's session, its
answer compared with the one the variant gave on the exporting CPU (docs/model-package.md, "Probe").

A variant that answers otherwise here is treated as refused (server/repository/loading.py falls back to the next
variant and says why in the version's reason); packages without a probe, and encoder-decoders, are not checked.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np
import onnxruntime as ort

from server.repository.package import Package, PackageError

log = logging.getLogger(__name__)

_ONNX_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int8)": np.int8,
               "tensor(uint8)": np.uint8, "tensor(int64)": np.int64, "tensor(int32)": np.int32}


def probe_file(package: Package) -> str | None:
    """The probe's file name when parity.json has a probe block (then it is one of the files the server opens)."""
    block: Any = package.parity.get("probe")
    return block.get("file") if isinstance(block, dict) and isinstance(block.get("file"), str) else None


def probe_mismatch(package: Package, variant: str, session: ort.InferenceSession) -> str | None:
    """Why `variant` does not compute here what it computed at export; None when it does or has no probe."""
    block: Any = package.parity.get("probe")
    name = probe_file(package)
    if name is None or variant not in (block.get("variants") or ()):
        return None
    try:
        with np.load(package.file(name), allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise PackageError(f"{name}: not a probe file ({exc})") from None
    feeds = {k.removeprefix("feed."): v for k, v in arrays.items() if k.startswith("feed.")}
    want = arrays.get(f"answer.{variant}")
    if want is None:
        raise PackageError(f"{name}: no answer.{variant} although parity.json's probe lists {variant}")
    got = session.run([session.get_outputs()[0].name], {**feeds, **_zero_cache(session, feeds, package)})[0]
    worst = float(np.abs(got.astype(np.float64) - want).max()) if got.shape == want.shape else float("inf")
    bound = float(block.get("tolerance", 0.0)) * max(1.0, float(np.abs(want).max()))
    if worst <= bound:
        log.debug("%s variant %s: probe within %.3g (bound %.3g)", package.name, variant, worst, bound)
        return None
    return (f"its probe answers differently on this CPU (largest difference {worst:.3g}, bound {bound:.3g}): "
            "its gate's verdict does not hold here")


def _zero_cache(session: ort.InferenceSession, feeds: dict[str, np.ndarray], package: Package
                ) -> dict[str, np.ndarray]:
    # A decoder's past buffers: zeros of one row and the package's max length (a first prompt reads none of them).
    zeros = {}
    for graph_input in session.get_inputs():
        if graph_input.name in feeds:
            continue
        dims = [d if isinstance(d, int) else package.manifest.max_length for d in graph_input.shape]
        zeros[graph_input.name] = np.zeros([1, *dims[1:]], _ONNX_TYPES[graph_input.type])
    return zeros
