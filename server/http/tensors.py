"""KServe v2 REST tensors <-> numpy: JSON `data` and Triton's binary tensor extension.

Binary extension (what tritonclient.http speaks): the body is a JSON header of `Inference-Header-Content-Length`
bytes followed by the raw tensors, in input order, of every input whose `parameters.binary_data_size` is set.
Raw bytes are the same as gRPC raw contents (server/protocol/codecs.py: little-endian, BYTES length-prefixed). An answer
carries an output in binary when the request's output asks `parameters.binary_data`, or, for outputs not
listed, when the request parameter `binary_data_output` is true.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from server.protocol.codecs import DATATYPES, check_bytes_count, check_shape, decode_tensor, encode_tensor, numpy_dtype
from server.protocol.errors import ServingError
from server.http.errors import HttpError

HEADER_LENGTH = "inference-header-content-length"


@dataclass
class InferRequest:
    id: str
    inputs: dict[str, np.ndarray]
    outputs: list[str] | None           # None: every output
    binary_outputs: set[str] = field(default_factory=set)
    binary_default: bool = False        # for outputs not listed in the request
    parameters: dict[str, Any] = field(default_factory=dict)


def header_length(text: str | None) -> int | None:
    """The Inference-Header-Content-Length header as a byte count (None when absent)."""
    if text is None:
        return None
    if not (text.isascii() and text.isdigit()):   # ('²' is a digit to isdigit(), not to int())
        raise HttpError(400, f"inference-header-content-length: not a byte count: {text!r}")
    return int(text)


def split_body(body: bytes, length: int | None) -> tuple[bytes, memoryview]:
    """(JSON header, binary tail) of a request body whose header is `length` bytes (None: all of it). The tail
    is a view, not a copy: it may be most of a 64 MiB body."""
    if length is None:
        return body, memoryview(b"")
    if length > len(body):
        raise HttpError(400, f"inference-header-content-length: {length} is not a length within the "
                             f"{len(body)}-byte body")
    view = memoryview(body)
    return bytes(view[:length]), view[length:]


def _flatten(data: Any, out: list[Any], most: int) -> None:
    """The leaves of nested lists, in order; stops once there are more than `most` (the shape's count)."""
    stack = [data]
    while stack and len(out) <= most:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        else:
            out.append(item)


def _from_json(name: str, datatype: str, shape: list[int], data: Any, where: str,
               max_bytes_elements: int) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        check_bytes_count(count, max_bytes_elements, f"{where}.shape")
    values: list[Any] = []
    _flatten(data, values, count)
    if len(values) != count:
        got = f"more than {count}" if len(values) > count else str(len(values))
        raise ServingError.invalid(f"{where}.data", f"{got} values, shape {shape} needs {count}")
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in values):
            raise ServingError.invalid(f"{where}.data", "BYTES elements must be strings")
        out = np.empty(count, dtype=object)
        out[:] = [v.encode("utf-8") for v in values]
        return out.reshape(shape)
    if datatype == "BOOL":
        if not all(isinstance(v, bool) for v in values):
            raise ServingError.invalid(f"{where}.data", "BOOL elements must be true or false")
        return np.array(values, dtype=np.bool_).reshape(shape)
    integer = datatype.startswith(("INT", "UINT"))
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
            raise ServingError.invalid(f"{where}.data", f"{datatype} elements must be "
                                                        f"{'integers' if integer else 'numbers'}, got {v!r}"[:120])
    dtype = numpy_dtype(datatype)
    if integer:
        info = np.iinfo(dtype)
        if values and (min(values) < info.min or max(values) > info.max):
            raise ServingError.invalid(f"{where}.data", f"a value is outside the {datatype} range")
    return np.array(values, dtype=dtype).reshape(shape)


def _shape(tensor: dict[str, Any], where: str) -> list[int]:
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise ServingError.invalid(f"{where}.shape", "must be a list of integers")
    check_shape(shape, f"{where}.shape")
    return shape


def _parameters(obj: dict[str, Any], where: str) -> dict[str, Any]:
    params = obj.get("parameters") or {}
    if not isinstance(params, dict):
        raise ServingError.invalid(f"{where}parameters", "must be an object")
    return params


def decode_request(header: Any, binary: bytes | memoryview, max_bytes_elements: int) -> InferRequest:
    """The JSON header (already parsed) + the binary tail -> arrays; errors name the field. A BYTES tensor's
    element count (from its shape) is checked against `max_bytes_elements` before it is decoded."""
    if not isinstance(header, dict):
        raise ServingError.invalid("body", "must be a JSON object")
    request_id = header.get("id", "")
    if not isinstance(request_id, str):
        raise ServingError.invalid("id", "must be a string")
    tensors = header.get("inputs")
    if not isinstance(tensors, list) or not tensors:
        raise ServingError.invalid("inputs", "must be a non-empty list of tensors")
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for i, tensor in enumerate(tensors):
        where = f"inputs[{i}]"
        if not isinstance(tensor, dict):
            raise ServingError.invalid(where, "must be an object")
        name, datatype = tensor.get("name"), tensor.get("datatype")
        if not isinstance(name, str) or not name:
            raise ServingError.invalid(f"{where}.name", "must be a non-empty string")
        if name in inputs:
            raise ServingError.invalid(f"{where}.name", f"duplicate input {name!r}")
        if not isinstance(datatype, str) or datatype not in DATATYPES:
            raise ServingError.invalid(f"{where}.datatype", f"unknown datatype {datatype!r}")
        shape = _shape(tensor, where)
        size = _parameters(tensor, f"{where}.").get("binary_data_size")
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise ServingError.invalid(f"{where}.parameters.binary_data_size",
                                           f"{size!r} bytes do not fit the {len(binary) - offset} binary bytes left")
            raw = binary[offset:offset + size]
            offset += size
            inputs[name] = decode_tensor(name, datatype, shape, raw, None, where, max_bytes_elements)
        elif "data" in tensor:
            inputs[name] = _from_json(name, datatype, shape, tensor["data"], where, max_bytes_elements)
        else:
            raise ServingError.invalid(f"{where}.data", "missing (and no parameters.binary_data_size)")
    if offset != len(binary):
        raise ServingError.invalid("body", f"{len(binary) - offset} binary bytes after the last binary input")
    params = _parameters(header, "")
    binary_default = params.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise ServingError.invalid("parameters.binary_data_output", "must be a boolean")
    outputs, binary_outputs = _requested_outputs(header.get("outputs"))
    return InferRequest(id=request_id, inputs=inputs, outputs=outputs, binary_outputs=binary_outputs,
                        binary_default=binary_default, parameters=params)


def _requested_outputs(requested: Any) -> tuple[list[str] | None, set[str]]:
    if requested is None:
        return None, set()
    if not isinstance(requested, list):
        raise ServingError.invalid("outputs", "must be a list")
    names: list[str] = []
    binary: set[str] = set()
    for i, out in enumerate(requested):
        if not isinstance(out, dict) or not isinstance(out.get("name"), str):
            raise ServingError.invalid(f"outputs[{i}].name", "must be a string")
        names.append(out["name"])
        flag = _parameters(out, f"outputs[{i}].").get("binary_data", False)
        if not isinstance(flag, bool):
            raise ServingError.invalid(f"outputs[{i}].parameters.binary_data", "must be a boolean")
        if flag:
            binary.add(out["name"])
    return names or None, binary


def _json_data(array: np.ndarray) -> list[Any]:
    flat = array.reshape(-1)
    if array.dtype == object or array.dtype.kind in "SU":
        return [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v) for v in flat]
    return flat.tolist()


def encode_response(request: InferRequest, model: str, version: int,
                    outputs: dict[str, np.ndarray]) -> tuple[bytes, int | None]:
    """(body, JSON header length or None when the body is JSON only)."""

    described: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    listed = set(request.outputs or ())
    for name, array in outputs.items():
        datatype, shape, raw = encode_tensor(array)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
        binary = name in request.binary_outputs or (name not in listed and request.binary_default)
        if binary:
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _json_data(array)
        described.append(entry)
    head: dict[str, Any] = {"model_name": model, "model_version": str(version), "outputs": described}
    if request.id:
        head["id"] = request.id
    header = json.dumps(head, separators=(",", ":")).encode()
    if not chunks:
        return header, None
    return header + b"".join(chunks), len(header)
