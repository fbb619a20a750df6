"""A graph's input/output signature from the manifest, and the validation of caller tensors against it.

Dimensions in model.json are ints (fixed), names ("batch") or sums of names ("past_sequence + sequence").
Checking that named dimensions agree across inputs catches what onnxruntime reports only as an opaque
broadcast error deep inside the graph (e.g. an attention mask whose length is not past + sequence).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from modelpkg import TensorDecl
from server.protocol.codecs import kserve_datatype, numpy_dtype
from server.protocol.errors import ServingError

_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
Dim = int | tuple[str, ...] | None  # fixed size | sum of named sizes | unchecked


def _parse_dim(raw: Any) -> Dim:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw if raw >= 0 else None
    if isinstance(raw, str):
        parts = [p.strip() for p in raw.split("+")]
        if parts and all(_SYMBOL.fullmatch(p) for p in parts):
            return tuple(parts)
    return None


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # KServe name, e.g. "INT64"
    dims: tuple[Dim, ...]

    @property
    def metadata_shape(self) -> list[int]:
        """KServe metadata shape: -1 for every dynamic axis."""
        return [d if isinstance(d, int) else -1 for d in self.dims]


def specs_from_manifest(decls: Sequence[TensorDecl]) -> list[TensorSpec]:
    return [TensorSpec(name=d.name, datatype=kserve_datatype(d.dtype), dims=tuple(_parse_dim(x) for x in d.shape))
            for d in decls]


def check_inputs(specs: list[TensorSpec], arrays: dict[str, np.ndarray]) -> None:
    """INVALID_ARGUMENT naming the input when a tensor is missing, unknown, or of the wrong dtype/shape."""
    known = {s.name for s in specs}
    for name in arrays:
        if name not in known:
            raise ServingError.invalid(f"inputs[{name!r}]", f"not an input of this model (inputs: {sorted(known)})")
    sizes: dict[str, int] = {}
    sums: list[tuple[TensorSpec, int, tuple[str, ...], int]] = []
    for spec in specs:
        if spec.name not in arrays:
            raise ServingError.invalid("inputs", f"missing input {spec.name!r}")
        array = arrays[spec.name]
        want = numpy_dtype(spec.datatype)
        if array.dtype != want:
            got = "BYTES" if array.dtype == object else kserve_datatype(array.dtype.name)
            raise ServingError.invalid(f"inputs[{spec.name!r}].datatype", f"expected {spec.datatype}, got {got}")
        if array.ndim != len(spec.dims):
            raise ServingError.invalid(f"inputs[{spec.name!r}].shape",
                                       f"expected rank {len(spec.dims)}, got shape {list(array.shape)}")
        for axis, (dim, size) in enumerate(zip(spec.dims, array.shape)):
            if isinstance(dim, int) and size != dim:
                raise ServingError.invalid(f"inputs[{spec.name!r}].shape",
                                           f"axis {axis} must be {dim}, got {size}")
            if isinstance(dim, tuple) and len(dim) == 1:
                symbol = dim[0]
                if sizes.setdefault(symbol, size) != size:
                    raise ServingError.invalid(
                        f"inputs[{spec.name!r}].shape",
                        f"axis {axis} ({symbol}) is {size} but another input has {symbol} = {sizes[symbol]}")
            elif isinstance(dim, tuple):
                sums.append((spec, axis, dim, size))
    for spec, axis, symbols, size in sums:
        if all(s in sizes for s in symbols) and sum(sizes[s] for s in symbols) != size:
            expected = " + ".join(f"{s} ({sizes[s]})" for s in symbols)
            raise ServingError.invalid(f"inputs[{spec.name!r}].shape",
                                       f"axis {axis} must be {expected} = {sum(sizes[s] for s in symbols)}, got {size}")
