"""Find the string field of a serialized protobuf message whose bytes are not UTF-8 (to name it in an error).

protobuf refuses such a message with "String field had bad UTF-8" and no field name; this walks the wire
format against the message's descriptor and returns the path of the first bad field ("inputs[0].text").
Standard library + the descriptor only; never raises on malformed input (returns None).
"""
from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from server.protocol.protowire import read_varint as _varint

_MAX_DEPTH = 32


def bad_utf8_field(descriptor: Descriptor, data: bytes) -> str | None:
    """The path of the first string field holding invalid UTF-8, or None (none found, or not parseable)."""
    try:
        return _walk(descriptor, data, "", 0)
    except (ValueError, IndexError):
        return None


def _walk(descriptor: Descriptor, data: bytes, prefix: str, depth: int) -> str | None:
    if depth > _MAX_DEPTH:
        return None
    seen: dict[int, int] = {}
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _, pos = _varint(data, pos)
            continue
        if wire_type == 1:
            pos += 8
            continue
        if wire_type == 5:
            pos += 4
            continue
        if wire_type != 2:
            return None  # groups: not used by our protos
        length, pos = _varint(data, pos)
        value = data[pos:pos + length]
        pos += length
        field: Any = descriptor.fields_by_number.get(number)
        if field is None:
            continue
        index = seen.get(number, 0)
        seen[number] = index + 1
        name = prefix + field.name + (f"[{index}]" if _repeated(field) and not _is_map(field) else "")
        if _is_map(field):
            name = prefix + field.name
        if field.type == FieldDescriptor.TYPE_STRING:
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                return name
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            found = _walk(field.message_type, value, name + ".", depth + 1)
            if found is not None:
                return found
    return None


def _repeated(field: Any) -> bool:
    repeated = getattr(field, "is_repeated", None)  # protobuf >= 6; `label` before
    return bool(repeated) if repeated is not None else getattr(field, "label", None) == FieldDescriptor.LABEL_REPEATED


def _is_map(field: Any) -> bool:
    message = field.message_type
    return message is not None and message.GetOptions().map_entry


__all__ = ["bad_utf8_field"]
