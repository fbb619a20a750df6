"""The external data files an ONNX graph names (TensorProto.external_data `location`): onnxruntime opens them beside
the graph, so they are files the server reads (server/repository/served_files.py) and must be listed in parity.json.

The exporter writes self-contained graphs except those past protobuf's 2 GiB limit, whose weights go to
`<graph>.data` (export/graph_file.py, docs/model-package.md); a graph rewritten after publication may name others. The server has no `onnx` package: this walks the protobuf wire format of the
messages that can hold tensors (model -> graphs -> initializers, sparse initializers, node attributes, subgraphs,
functions, training info), skipping every other field by its length without reading it.
"""
from __future__ import annotations

import mmap
from pathlib import Path
from typing import Iterator

from server.protocol.protowire import read_varint

# message -> {field number: message it holds}
_MODEL, _GRAPH, _NODE, _ATTRIBUTE, _TENSOR, _SPARSE, _FUNCTION, _TRAINING, _ENTRY = range(9)
_CHILDREN = {
    _MODEL: {7: _GRAPH, 20: _TRAINING, 25: _FUNCTION},
    _TRAINING: {1: _GRAPH, 2: _GRAPH},
    _FUNCTION: {7: _NODE},
    _GRAPH: {1: _NODE, 5: _TENSOR, 15: _SPARSE},
    _NODE: {5: _ATTRIBUTE},
    _ATTRIBUTE: {5: _TENSOR, 6: _GRAPH, 10: _TENSOR, 11: _GRAPH, 22: _SPARSE, 23: _SPARSE},
    _SPARSE: {1: _TENSOR, 2: _TENSOR},
    _TENSOR: {13: _ENTRY},
}
_MAX_DEPTH = 64


def _fields(buf: memoryview) -> Iterator[tuple[int, memoryview | None]]:
    """(field number, its bytes when length-delimited else None) of one message."""
    pos = 0
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        kind = key & 7
        if kind == 0:
            _, pos = read_varint(buf, pos)
            yield key >> 3, None
        elif kind in (1, 5):
            pos += 8 if kind == 1 else 4
            yield key >> 3, None
        elif kind == 2:
            size, pos = read_varint(buf, pos)
            if pos + size > len(buf):
                raise ValueError("malformed protobuf")
            yield key >> 3, buf[pos:pos + size]
            pos += size
        else:
            raise ValueError("malformed protobuf")
    if pos != len(buf):
        raise ValueError("malformed protobuf")


def _walk(buf: memoryview, message: int, depth: int, found: list[str]) -> None:
    if message == _ENTRY:
        entry = {number: bytes(value) for number, value in _fields(buf) if value is not None}
        if entry.get(1) == b"location" and 2 in entry:
            found.append(entry[2].decode("utf-8", "replace"))
        return
    if depth > _MAX_DEPTH:
        raise ValueError("malformed protobuf")
    children = _CHILDREN[message]
    for number, value in _fields(buf):
        if value is not None and number in children:
            _walk(value, children[number], depth + 1, found)


def external_data_files(graph: Path) -> list[str]:
    """The locations a graph's tensors keep their data in, each once; [] for a self-contained graph, and for a
    file that is not a readable ONNX model (onnxruntime's own load then says what is wrong with it)."""
    found: list[str] = []
    try:
        with graph.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                _walk(view, _MODEL, 0, found)
            except ValueError:      # not a protobuf: caught here, so no slice of the map outlives it
                found = []
            finally:
                view.release()
    except (OSError, ValueError):   # missing, unreadable, empty (mmap of 0 bytes)
        return []
    return list(dict.fromkeys(found))
