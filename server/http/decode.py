"""JSON request bodies decoded once into typed request objects (msgspec Structs), refusals naming the field.

msgspec checks every field's type while it parses (C code: no dict is built and then walked again). Its
refusals are reworded here into the server's own shape, so that a field is named the same way whichever
door or body reader saw it (`messages[1].role: must be a string, got 5`, `model: is required`):

- null stands for an absent field: optional fields are typed `X | None`, and a null where a value is
  required reads "is required";
- bool is never an integer, and an integer is accepted where a number is asked for (msgspec's rules too);
- NaN / Infinity (which Python's json module reads, msgspec does not) are refused naming their field.

Only a refused body is parsed a second time (by the json module, server/protocol/jsontext.py, to quote the offending value
or name what it cannot read: an integer beyond Python's digit limit, a lone surrogate).
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, TypeVar

import msgspec
from starlette.requests import Request

from server.protocol.errors import ServingError
from server.http.body import JSON_TYPES, read_body, require_content_type
from server.http.errors import HttpError
from server.protocol.jsontext import lenient

T = TypeVar("T")
_DECODERS: dict[type, msgspec.json.Decoder[Any]] = {}
_TYPE_NAMES = {"str": "a string", "int": "an integer", "float": "a number", "bool": "a boolean", "array": "a list",
               "object": "an object"}
_WRONG_TYPE = re.compile(r"Expected `([^`]*)`, got `[^`]*`")
_MISSING = re.compile(r"Object missing required field `([^`]*)`")
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")


def _decoder(kind: type[T]) -> msgspec.json.Decoder[T]:
    found = _DECODERS.get(kind)
    if found is None:
        found = _DECODERS[kind] = msgspec.json.Decoder(kind)
    return found


async def typed_body(request: Request, limit: int, kind: type[T]) -> T:
    """An application/json body decoded into `kind` (a msgspec Struct); 400 naming the field otherwise. A body
    that names a model names it for the request metrics too (the guard reads `request.state.model`)."""
    require_content_type(request, JSON_TYPES)
    body = decode(await read_body(request, limit), kind)
    model = getattr(body, "model", None)
    if isinstance(model, str):
        request.state.model = model
    return body


def decode(data: bytes, kind: type[T]) -> T:
    try:
        return _decoder(kind).decode(data)
    except UnicodeDecodeError:
        raise HttpError(400, "body: not UTF-8 text") from None
    except msgspec.ValidationError as exc:
        raise _refusal(str(exc), data) from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _malformed(str(exc) if isinstance(exc, msgspec.DecodeError) else "nested too deeply", data) from None


def _refusal(message: str, data: bytes) -> Exception:
    """msgspec's "Expected `int | null`, got `str` - at `$.n`" as "n: must be an integer, got \"x\"\"."""
    problem, _, where = message.partition(" - at `")
    steps = _steps(where.rstrip("`") or "$")
    try:
        body = lenient(data)
    except ServingError as exc:   # an integer beyond Python's digit limit, a lone surrogate: named where it is
        return exc
    missing = _MISSING.fullmatch(problem)
    if missing:
        return ServingError.invalid(_label([*steps, missing.group(1)]), "is required")
    steps, value = _value_at(body, steps)
    if not steps:    # the body itself
        return HttpError(400, f"body: must be a JSON object, got {type(body).__name__}")
    label = _label(steps)
    if value is None:
        return ServingError.invalid(label, "is required")
    wrong = _WRONG_TYPE.fullmatch(problem)
    if wrong:
        names = [_TYPE_NAMES.get(t, t) for t in wrong.group(1).split(" | ") if t != "null"]
        return ServingError.invalid(label, f"must be {' or '.join(names)}, got {json.dumps(value)[:40]}")
    found = _non_finite(value, steps)   # "Number out of range": 1e400 is inf to the json module
    if found is not None:
        return ServingError.invalid(_label(found[0]), f"must be finite, got {found[1]}")
    return ServingError.invalid(label, f"{problem[:1].lower()}{problem[1:]}, got {json.dumps(value)[:40]}")


def _malformed(message: str, data: bytes) -> Exception:
    """Not JSON to msgspec: the json module's account of it (line and column, or the field holding a lone
    surrogate), or, for the NaN / Infinity it reads, the field that holds one."""
    body = lenient(data)   # raises the refusal naming what it cannot read
    found = _non_finite(body, [])
    if found is not None:
        steps, value = found
        return ServingError.invalid(_label(steps) or "body", f"must be finite, got {value}")
    return HttpError(400, f"body: malformed JSON ({message})")


def _steps(path: str) -> list[str | int]:
    """"$.messages[0].role" -> ["messages", 0, "role"] ("[...]", a dict key msgspec does not name, ends it)."""
    steps: list[str | int] = []
    for name, index in _STEP.findall(path[1:]):
        if index == "...":
            break
        steps.append(name if name else int(index))
    return steps


def _value_at(body: Any, steps: list[str | int]) -> tuple[list[str | int], Any]:
    """The value at `steps`, and the steps that reached it (fewer when the document ends sooner)."""
    value = body
    for i, step in enumerate(steps):
        if isinstance(step, int) and isinstance(value, list) and step < len(value):
            value = value[step]
        elif isinstance(step, str) and isinstance(value, dict):
            value = value.get(step)
        else:
            return steps[:i], value
    return steps, value


def _label(steps: list[str | int]) -> str:
    return "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in steps).lstrip(".")


def _non_finite(value: Any, steps: list[str | int]) -> tuple[list[str | int], float] | None:
    if isinstance(value, float) and not math.isfinite(value):
        return steps, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite(item, [*steps, key])
        if found is not None:
            return found
    return None
