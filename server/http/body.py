"""Request bodies and headers: size limit, content type, JSON, typed fields, deadlines.

Every refusal names what is wrong: the header, or the JSON field (`messages[1].content: must be a string`).
"""
from __future__ import annotations

import json
import math
import time
from typing import Any, TypeVar

from starlette.requests import ClientDisconnect, Request

from server.protocol import jsontext
from server.protocol.errors import Code, ServingError
from server.http.errors import HttpError

T = TypeVar("T")
JSON_TYPES = ("application/json",)
# Deadline headers, in seconds: ours, then the one the openai Python client sends with its own timeout.
TIMEOUT_HEADERS = ("x-request-timeout", "x-stainless-timeout")
_MISSING = object()


async def read_body(request: Request, limit: int, json_prefix: int | None = None) -> bytes:
    """The whole body; 413 when it is (or announces to be) larger than `limit` bytes. Its JSON (the first
    `json_prefix` bytes; None: all of it) has its values bounded while it arrives, chunk by chunk
    (server/protocol/jsontext.py), so a body of millions of tiny values is refused before anything parses it."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):   # ('²' is a digit to isdigit(), not to int())
            raise HttpError(400, f"content-length: not a byte count: {declared!r}")
        if int(declared) > limit:
            raise HttpError(413, f"body: {declared} bytes, the limit is {limit} (--max-message-bytes)")
    counter = jsontext.ValueCounter()
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            if json_prefix is None:
                counter.add(chunk)
            elif size < json_prefix:
                counter.add(chunk[:json_prefix - size])
            size += len(chunk)
            if size > limit:
                raise HttpError(413, f"body: more than {limit} bytes (--max-message-bytes)")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ServingError(Code.CANCELLED, "client: disconnected while sending the body") from None
    body_read = getattr(request.state, "body_read", None)
    if body_read is not None:   # the route guard watches the connection from now on (guard._while_connected)
        body_read.set()
    return b"".join(chunks)


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").partition(";")[0].strip().lower()


def require_content_type(request: Request, allowed: tuple[str, ...], missing_ok: bool = False) -> None:
    kind = media_type(request)
    if (not kind and missing_ok) or kind in allowed:
        return
    raise HttpError(415, f"content-type: expected {' or '.join(allowed)}, got {kind or 'none'!r}")


def parse_json(data: bytes, what: str = "body", counted: bool = True) -> Any:
    """A JSON document (server/protocol/jsontext.py): 400 naming the field for what is not JSON or not text; its values
    were bounded while it was read (`counted`) unless told otherwise."""
    return jsontext.loads(data, counted=counted, name=what)


def _type_name(kind: type | tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "a list",
             dict: "an object"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def field(body: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = _MISSING,
          prefix: str = "") -> Any:
    """body[name] checked against `kind` (null = absent); INVALID_ARGUMENT naming the field otherwise.

    bool is never an int here, and an int is accepted where a float is asked for.
    """
    label = f"{prefix}{name}"
    value = body.get(name)
    if value is None:
        if default is _MISSING:
            raise ServingError.invalid(label, "is required")
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = any(isinstance(value, k) and not (isinstance(value, bool) and k in (int, float)) for k in kinds)
    if not ok and float in kinds and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise ServingError.invalid(label, f"must be {_type_name(kind)}, got {json.dumps(value)[:40]}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ServingError.invalid(label, f"must be finite, got {value}")
    return value


def deadline_from_headers(request: Request) -> float | None:
    """A time.monotonic() deadline from a timeout header in seconds (None when there is none)."""
    for header in TIMEOUT_HEADERS:
        text = request.headers.get(header)
        if text is None:
            continue
        try:
            seconds = float(text)
        except ValueError:
            raise HttpError(400, f"{header}: must be a number of seconds, got {text!r}") from None
        if not math.isfinite(seconds) or seconds <= 0:
            raise HttpError(400, f"{header}: must be a positive number of seconds, got {text!r}")
        return time.monotonic() + seconds
    return None
