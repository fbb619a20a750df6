"""A request's structured-output constraint, as the doors hand it to the engine: what kind, its text, and the
request field it came from (every refusal names that field).

Kinds: `json_schema` (the schema as JSON text; OpenAI's json_object is the schema {"type": "object"}), `regex`,
`choice` (the options as a JSON list of strings) and `grammar` (Lark, as llguidance reads it, `%json` included;
or llama.cpp's GBNF, which llguidance converts).
Checked here without the library: the size and the nesting of what a request brings are bounded as other bodies are,
before the model compiles it (matcher.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

KINDS = ("json_schema", "regex", "choice", "grammar")
MAX_CONSTRAINT_CHARS = 65_536    # a schema's JSON text, a regex or a grammar
MAX_SCHEMA_DEPTH = 32            # nested objects / lists in a schema
MAX_CHOICES = 256
JSON_OBJECT = '{"type": "object"}'


@dataclass(frozen=True)
class Constraint:
    kind: str
    text: str
    # The request's field it came from ("response_format.json_schema.schema", "guided_regex", "constraint.regex"):
    # named in every refusal; not part of what it means (two requests' equal constraints share one compilation).
    field: str = field(default="constraint", compare=False)

    @property
    def key(self) -> tuple[str, str]:
        return self.kind, self.text


def constraint_of(kind: str, value: Any, field_name: str) -> Constraint:
    """A checked constraint from a request's value (a schema as a dict or JSON text, a regex, a list of options, a
    grammar); ValueError naming `field_name`."""
    if kind not in KINDS:
        raise ValueError(f"{field_name}: unknown constraint kind {kind!r}; one of {', '.join(KINDS)}")
    if kind == "json_schema":
        if isinstance(value, str):
            if len(value) > MAX_CONSTRAINT_CHARS:
                raise ValueError(f"{field_name}: {len(value)} characters, more than the {MAX_CONSTRAINT_CHARS} a "
                                 "constraint may have")
            try:
                value = json.loads(value)
            except (ValueError, RecursionError) as exc:
                raise ValueError(f"{field_name}: not valid JSON: {exc}") from None
        if not isinstance(value, (dict, bool)):
            raise ValueError(f"{field_name}: a JSON schema must be an object, got {type(value).__name__}")
        depth = _depth(value)
        if depth > MAX_SCHEMA_DEPTH:
            raise ValueError(f"{field_name}: the schema nests {depth} levels deep, more than {MAX_SCHEMA_DEPTH}")
        text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    elif kind == "choice":
        text = _choices(value, field_name)
    else:
        if not isinstance(value, str) or not value:
            raise ValueError(f"{field_name}: must be a non-empty string")
        text = value
    check_constraint(Constraint(kind, text, field_name))
    return Constraint(kind, text, field_name)


def check_constraint(constraint: Any) -> None:
    """ValueError naming the constraint's field when it is not a Constraint or exceeds the size bound."""
    if not isinstance(constraint, Constraint) or constraint.kind not in KINDS:
        raise ValueError(f"parameters.constraint: must be a Constraint, got {type(constraint).__name__}")
    if len(constraint.text) > MAX_CONSTRAINT_CHARS:
        raise ValueError(f"{constraint.field}: {len(constraint.text)} characters, more than the "
                         f"{MAX_CONSTRAINT_CHARS} a constraint may have")


def _choices(value: Any, field_name: str) -> str:
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{field_name}: must be a non-empty list of strings")
    if len(value) > MAX_CHOICES:
        raise ValueError(f"{field_name}: at most {MAX_CHOICES} options, got {len(value)}")
    for i, option in enumerate(value):
        if not isinstance(option, str) or not option:
            raise ValueError(f"{field_name}[{i}]: must be a non-empty string")
    return json.dumps(list(value), ensure_ascii=False)


def _depth(value: Any) -> int:
    """How deeply lists and objects nest in `value` (a scalar: 0), without recursion (a hostile schema may nest
    deeper than Python's stack)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level > MAX_SCHEMA_DEPTH:
            return level
        todo.extend((child, level + 1) for child in children)
    return deepest
