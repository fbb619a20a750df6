"""The structured-output forms of an OpenAI request -> the one Constraint its generation obeys.

Accepted, on /v1/completions and /v1/chat/completions alike: OpenAI's `response_format` (text, json_object,
json_schema with its schema; `strict` or not, the schema is enforced), vLLM's `structured_outputs` {json, regex,
choice, grammar, json_object} and its older `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`.
At most one of them per request (and, in chat, not with a tool choice that forces a call); each refusal names the
field. Whether the model can compile it is decided at admission (server/structured/matcher.py), also by name.
"""
from __future__ import annotations

from typing import Any

import msgspec

from server.protocol.errors import Code, ServingError
from server.structured import Constraint, constraint_of

_GUIDED = (("guided_json", "json_schema"), ("guided_regex", "regex"), ("guided_choice", "choice"),
           ("guided_grammar", "grammar"))
_STRUCTURED = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}
# structured_outputs keys that do not change what is enforced here (vLLM's backend choice).
_STRUCTURED_NEUTRAL = ("disable_fallback", "backend")


def _given(value: Any) -> bool:
    return value is not msgspec.UNSET and value is not None


def request_constraint(request: Any) -> Constraint | None:
    """The request's constraint (None: unconstrained); INVALID_ARGUMENT naming the field."""
    found: list[Constraint] = []
    try:
        if _given(request.response_format):
            found += _response_format(request.response_format)
        if _given(request.structured_outputs):
            found += _structured_outputs(request.structured_outputs)
        for name, kind in _GUIDED:
            value = getattr(request, name)
            if _given(value):
                found.append(constraint_of(kind, value, name))
    except ValueError as exc:
        raise ServingError(Code.INVALID_ARGUMENT, str(exc)) from None
    if len(found) > 1:
        raise ServingError.invalid(found[1].field, f"only one structured-output constraint per request; "
                                                   f"{found[0].field} was given too")
    return found[0] if found else None


def _response_format(value: Any) -> list[Constraint]:
    if not isinstance(value, dict):
        raise ValueError("response_format: must be an object with a type")
    kind = value.get("type")
    if kind == "text":
        return []
    if kind == "json_object":
        return [constraint_of("json_schema", {"type": "object"}, "response_format")]
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise ValueError("response_format.json_schema.schema: required with type json_schema")
        return [constraint_of("json_schema", spec["schema"], "response_format.json_schema.schema")]
    raise ValueError(f"response_format.type: must be \"text\", \"json_object\" or \"json_schema\", got {kind!r}")


def _structured_outputs(value: Any) -> list[Constraint]:
    if not isinstance(value, dict):
        raise ValueError("structured_outputs: must be an object")
    found = []
    for key, item in value.items():
        field = f"structured_outputs.{key}"
        if item is None or key in _STRUCTURED_NEUTRAL:
            continue
        if key in _STRUCTURED:
            found.append(constraint_of(_STRUCTURED[key], item, field))
        elif key == "json_object":
            if item is not True:
                raise ValueError(f"{field}: must be true when given")
            found.append(constraint_of("json_schema", {"type": "object"}, field))
        else:
            raise ValueError(f"{field}: is not supported by this server (json, regex, choice, grammar and "
                             "json_object are)")
    return found
