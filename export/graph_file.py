"""Writing a graph too large for one protobuf message: its weights go to an external data file beside it.

protobuf refuses to serialize a message past 2 GiB, so a decoder of ~0.5B fp32 parameters or more (Qwen3-0.6B's
in-place graph, its mixed twin, a weight-quantized graph before quantization) cannot be checked or saved as one file.
Such a graph is written with every initializer in `<graph file>.data` (onnxruntime opens it beside the graph, the
server verifies it like any package file: server/repository/external_data.py) and checked from the path; smaller
graphs stay self-contained, as before."""
from __future__ import annotations

from pathlib import Path

import onnx

# Initializer bytes above which a graph is written with external data: under 2 GiB with room for the graph itself.
EXTERNAL_ABOVE = 1_800_000_000


def initializer_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the graph's initializers as they would be serialized (raw data, or typed fields at their width)."""
    total = 0
    for t in model.graph.initializer:
        total += len(t.raw_data) if t.raw_data else 4 * (len(t.float_data) + len(t.int32_data)) + \
            8 * (len(t.int64_data) + len(t.double_data))
    return total


def save_checked(model: onnx.ModelProto, path: str | Path) -> None:
    """onnx.checker, then save `model` to `path`: self-contained, or with external data when it is too large
    (then `model`'s initializers point at the file afterwards)."""
    path = Path(path)
    if initializer_bytes(model) <= EXTERNAL_ABOVE:
        onnx.checker.check_model(model)
        onnx.save(model, str(path))
        return
    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)      # the writer appends
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data.name,
              size_threshold=1024)
    # onnx creates the data file owner-only; a package is read by whichever user runs the server, so it gets the
    # mode every other package file has (the process's umask applied, as for the graph beside it).
    data.chmod(path.stat().st_mode & 0o777)
    onnx.checker.check_model(str(path))


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A deep copy that does not serialize (a serialized copy fails past 2 GiB)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out
