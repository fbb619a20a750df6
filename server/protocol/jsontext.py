"""JSON text from clients (HTTP bodies, KServe's JSON-in-string parameters): bounded before it is parsed, and
every refusal naming where the problem is.

- The number of values is bounded BEFORE parsing, from their separators (`value_bound`: every value but the
  first of a container follows a comma, and every container opens with a bracket), so that a body of millions of
  `[],` is refused while it arrives instead of building millions of lists on the event loop (the figures:
  docs/RELIABILITY.md). HTTP bodies are counted chunk by chunk while they are read (server/http/body.py).
- `loads` parses with msgspec (C, faster than the json module: bench/FINDINGS.md); only a document msgspec
  refuses is parsed again, by the json module, to say what and where: malformed JSON (line, column), an
  integer literal beyond Python's digit limit (4300 digits, which the json module raises as a bare
  ValueError), a lone UTF-16 surrogate (`"\\ud800"`: not text; it fails later when encoded as UTF-8), nesting
  too deep. What the json module accepts and msgspec does not (NaN, Infinity, integers beyond 64 bits) is
  returned as the json module reads it, as before.
"""
from __future__ import annotations

import json
import sys
from typing import Any, Callable

import msgspec

from server.protocol.errors import ServingError

# Values in one JSON document: a JSON tensor of 1024 rows x 512 ids is 524,288 values; bigger tensors travel in
# KServe's binary form.
MAX_JSON_VALUES = 1 << 20
_SEPARATORS = (b",", b"[", b"{")
_DIGITS = sys.get_int_max_str_digits()   # 0: no limit


def value_bound(data: bytes) -> int:
    """At least the number of JSON values in `data` (commas and opening brackets; those inside strings count
    too: an over-estimate, never an under-estimate)."""
    return sum(data.count(s) for s in _SEPARATORS)


def check_value_count(count: int, name: str = "body") -> None:
    if count > MAX_JSON_VALUES:
        raise ServingError.invalid(name, f"more than {MAX_JSON_VALUES} JSON values (counted by their separators "
                                         "before parsing); send big tensors in KServe's binary form "
                                         "(parameters.binary_data_size), or fewer values per request")


class ValueCounter:
    """value_bound over a document that arrives in chunks: refused as soon as the bound passes the limit."""

    __slots__ = ("count", "_name")

    def __init__(self, name: str = "body") -> None:
        self.count, self._name = 0, name

    def add(self, chunk: bytes) -> None:
        self.count += value_bound(chunk)
        check_value_count(self.count, self._name)


def loads(data: bytes | str, where: str = "", counted: bool = False, name: str = "body") -> Any:
    """The JSON document `data`; INVALID_ARGUMENT naming the field otherwise. `where` is the field that holds the
    text ("" for a body: its fields are named from the top, and the document itself is `name`). counted: the
    caller already bounded its values (value_bound while reading it)."""
    label = where or name
    if not counted:
        encoded = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
        check_value_count(value_bound(encoded), label)
    try:
        return msgspec.json.decode(data)
    except UnicodeDecodeError:
        raise ServingError.invalid(label, "not UTF-8 text") from None
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        pass
    return lenient(data, where, name)


class _HugeInt:
    """An integer literal the json module cannot read (more digits than Python's limit), kept to be named."""

    def __init__(self, text: str) -> None:
        self.digits = len(text.lstrip("-"))


def _int(text: str) -> int | _HugeInt:
    return _HugeInt(text) if _DIGITS and len(text.lstrip("-")) > _DIGITS else int(text)


def lenient(data: bytes | str, where: str = "", name: str = "body") -> Any:
    """The json module's reading of `data`, refusing (naming the field) what it cannot read and what is not
    text: malformed JSON, too deep, integers beyond Python's digit limit, lone surrogates."""
    label = where or name
    try:
        body = json.loads(data, parse_int=_int)
    except UnicodeDecodeError:
        raise ServingError.invalid(label, "not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ServingError.invalid(label, f"malformed JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") \
            from None
    except RecursionError:
        raise ServingError.invalid(label, "malformed JSON (nested too deeply)") from None
    except ValueError as exc:
        raise ServingError.invalid(label, f"malformed JSON ({exc})") from None
    found = find(body, _unreadable)
    if found is not None:
        steps, value = found
        field = path_label(steps, where) or name
        if isinstance(value, _HugeInt):
            raise ServingError.invalid(field, f"an integer of {value.digits} digits is out of range")
        raise ServingError.invalid(field, "holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its "
                                          "pair), which is not text")
    return body


def _unreadable(value: Any) -> bool:
    return isinstance(value, _HugeInt) or (isinstance(value, str) and not _is_text(value))


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def find(value: Any, matches: Callable[[Any], bool], steps: list[str | int] | None = None
         ) -> tuple[list[str | int], Any] | None:
    """The first value for which `matches` holds, with the steps that reach it; for an object key, the object's
    steps (a key is never part of a label: it may be what cannot be shown). Iterative: a deep document cannot
    exhaust the stack."""
    stack: list[tuple[list[str | int], Any]] = [(steps or [], value)]
    while stack:
        path, item = stack.pop()
        if matches(item):
            return path, item
        if isinstance(item, dict):
            for key in item:
                if matches(key):
                    return path, key
            stack.extend(([*path, k], v) for k, v in reversed(list(item.items())))
        elif isinstance(item, list):
            stack.extend(([*path, i], v) for i, v in reversed(list(enumerate(item))))
    return None


def path_label(steps: list[str | int], prefix: str = "") -> str:
    """["messages", 1, "content"] -> "messages[1].content" (after `prefix` when given)."""
    text = "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in steps)
    return (prefix + text) if prefix else text.lstrip(".")


__all__ = ["MAX_JSON_VALUES", "ValueCounter", "check_value_count", "find", "lenient", "loads", "path_label",
           "value_bound"]
