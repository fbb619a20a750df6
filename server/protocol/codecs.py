"""KServe v2 tensors <-> numpy arrays (protocol-level only: no model knowledge here).

Raw contents are little-endian, row-major. A BYTES tensor's raw form is each element as a 4-byte
little-endian length followed by its bytes. Answers always go in raw_output_contents because
tritonclient reads only that.
"""
from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from server.protocol.errors import ServingError

# KServe datatype <-> numpy dtype (BYTES is an object array of `bytes`).
_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "INT8": np.dtype("<i1"), "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"), "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"),
    "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
DATATYPES = frozenset(_TO_NUMPY)

# Which InferTensorContents field holds each datatype.
_CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}
# Manifest / onnxruntime dtype names -> KServe datatype.
_FROM_NAME = {
    "bool": "BOOL", "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64",
    "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
    "float16": "FP16", "float32": "FP32", "float": "FP32", "float64": "FP64", "double": "FP64",
    "string": "BYTES",
}
_LEN = struct.Struct("<I")
_INT64_MAX = 2 ** 63 - 1


def kserve_datatype(dtype_name: str) -> str:
    """'int64' / 'float32' / 'tensor(int64)' -> 'INT64' / 'FP32'."""
    name = dtype_name.removeprefix("tensor(").removesuffix(")")
    try:
        return _FROM_NAME[name]
    except KeyError:
        raise ValueError(f"no KServe datatype for {dtype_name!r}") from None


def numpy_dtype(datatype: str) -> np.dtype:
    return _TO_NUMPY[datatype]


def datatype_of(array: np.ndarray) -> str:
    if array.dtype == object or array.dtype.kind in "SU":
        return "BYTES"
    return kserve_datatype(array.dtype.name)


def check_shape(shape: list[int], field: str) -> None:
    """Dimensions are int64 values >= 0 (KServe's shape type; JSON can say more) whose product, zeros left out,
    an array can address in bytes (numpy refuses [0, 2**62] of INT64 with a bare ValueError)."""
    for d in shape:
        if d < 0:
            raise ServingError.invalid(field, f"negative dimension in {list(shape)}")
        if d > _INT64_MAX:
            raise ServingError.invalid(field, f"dimension {d} is beyond int64 (KServe shapes are int64)")
    if math.prod(d for d in shape if d) > _INT64_MAX // 16:
        raise ServingError.invalid(field, f"{list(shape)} describes more elements than an array can address")


def check_bytes_count(count: int, most: int | None, field: str) -> None:
    """A BYTES tensor's elements are texts, one per row of a request (KServe text mode; no served graph takes
    BYTES): more than a request's rows are refused before any is decoded (each costs a Python object)."""
    if most is not None and count > most:
        raise ServingError.invalid(field, f"{count} BYTES elements exceed max_rows_per_request {most} (one text "
                                          "per element; send them in several requests)")


def decode_bytes(raw: bytes | memoryview, count: int, field: str) -> np.ndarray:
    """Length-prefixed elements -> object array of `count` bytes values (stops at the first element beyond
    `count`: a tensor of shape [1] holding millions of empty elements costs one step more than its shape)."""
    items: list[bytes] = []
    view = memoryview(raw)
    pos = 0
    while pos < len(view):
        if len(items) == count:
            raise ServingError.invalid(field, f"holds more BYTES elements than its shape's {count} (bytes from "
                                              f"byte {pos} on are left over)")
        if pos + 4 > len(view):
            raise ServingError.invalid(field, f"truncated BYTES element length at byte {pos}")
        (length,) = _LEN.unpack_from(view, pos)
        pos += 4
        if pos + length > len(view):
            raise ServingError.invalid(field, f"BYTES element {len(items)} runs past the end ({length} bytes)")
        items.append(bytes(view[pos:pos + length]))
        pos += length
    if len(items) != count:
        raise ServingError.invalid(field, f"holds {len(items)} BYTES elements, shape needs {count}")
    out = np.empty(count, dtype=object)
    out[:] = items
    return out


def encode_bytes(array: np.ndarray) -> bytes:
    parts: list[bytes] = []
    for item in array.reshape(-1):
        data = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        parts.append(_LEN.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def decode_tensor(name: str, datatype: str, shape: list[int], raw: bytes | memoryview | None, contents: Any,
                  field: str, max_bytes_elements: int | None = None) -> np.ndarray:
    """One request input -> numpy. `field` (e.g. "inputs[1]") prefixes every error message; a BYTES tensor of
    more than `max_bytes_elements` elements is refused before it is decoded."""
    if datatype not in _TO_NUMPY:
        raise ServingError.invalid(f"{field}.datatype", f"unknown datatype {datatype!r}")
    check_shape(shape, f"{field}.shape")
    count = math.prod(shape)  # Python ints: np.prod in int64 wraps (2**32 x 2**32 -> 0) and let huge shapes through
    if datatype == "BYTES":
        check_bytes_count(count, max_bytes_elements, f"{field}.shape")
    dtype = _TO_NUMPY[datatype]
    if raw is not None:
        if datatype == "BYTES":
            return decode_bytes(raw, count, f"raw_input_contents for {name!r}").reshape(shape)
        expected = count * dtype.itemsize
        if len(raw) != expected:
            raise ServingError.invalid(
                f"raw_input_contents for {name!r}",
                f"{len(raw)} bytes, shape {list(shape)} of {datatype} needs {expected}")
        return np.frombuffer(raw, dtype=dtype).reshape(shape)
    if datatype == "FP16":
        raise ServingError.invalid(f"{field}.contents", "FP16 tensors must be sent in raw_input_contents")
    values = getattr(contents, _CONTENTS_FIELD[datatype])
    if len(values) != count:
        raise ServingError.invalid(
            f"{field}.contents", f"{len(values)} values, shape {list(shape)} needs {count}")
    if datatype == "BYTES":
        out = np.empty(count, dtype=object)
        out[:] = list(values)
        return out.reshape(shape)
    return np.asarray(values, dtype=dtype).reshape(shape)


def encode_tensor(array: np.ndarray) -> tuple[str, list[int], bytes]:
    """numpy -> (datatype, shape, raw bytes)."""
    datatype = datatype_of(array)
    if datatype == "BYTES":
        return datatype, list(array.shape), encode_bytes(array)
    wanted = _TO_NUMPY[datatype]
    return datatype, list(array.shape), np.ascontiguousarray(array, dtype=wanted).tobytes()
