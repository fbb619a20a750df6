"""The protobuf wire format's one primitive both its readers share: a base-128 varint (server/grpc/wire.py walks
client messages with it, server/repository/external_data.py a package's ONNX graphs). Standard library only."""
from __future__ import annotations


def read_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """(value, position after it) of the varint at `pos`; ValueError when it is truncated or longer than 64 bits."""
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
