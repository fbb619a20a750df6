"""OpenAI tool calling, in Hermes' format (what Qwen2 / Qwen2.5, Hermes and many other chat templates write):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

`tools_of` checks a request's `tools`; `tool_constraint` turns `tool_choice` into the grammar that forces a call:
"required" one call (or several with parallel_tool_calls) of any of the tools, a named function one call of it,
each call's arguments constrained to its function's parameter schema; "auto" and "none" constrain nothing (auto's
calls are found in what the model writes: hermes.py). Errors are ValueError naming the request's field.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .spec import MAX_CONSTRAINT_CHARS, Constraint, constraint_of

MAX_TOOLS = 128
OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: dict[str, Any]
    definition: dict[str, Any]     # as the request gave it: what the chat template renders


def tools_of(value: Any) -> list[Tool]:
    """The request's `tools` (OpenAI's [{"type": "function", "function": {"name", "description", "parameters"}}])."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"tools: must be a list of tools, got {type(value).__name__}")
    if len(value) > MAX_TOOLS:
        raise ValueError(f"tools: at most {MAX_TOOLS} tools, got {len(value)}")
    tools: list[Tool] = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise ValueError(f"{where}.type: only \"function\" tools are served")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise ValueError(f"{where}.function: must be an object with a name")
        name = function.get("name")
        if not isinstance(name, str) or not name or len(name) > 64:
            raise ValueError(f"{where}.function.name: must be a non-empty string of at most 64 characters")
        if any(t.name == name for t in tools):
            raise ValueError(f"{where}.function.name: {name!r} is named by an earlier tool too")
        parameters = function.get("parameters", {"type": "object"})
        # Checked as any schema a request brings (size, nesting); compiled with the tool grammar.
        constraint_of("json_schema", parameters, f"{where}.function.parameters")
        tools.append(Tool(name, parameters, tool))
    return tools


def chosen_tools(tools: list[Tool], tool_choice: Any) -> tuple[str, list[Tool]]:
    """("none" | "auto" | "required" | "named", the tools a call may be of). OpenAI's default: "auto" with tools,
    "none" without."""
    if tool_choice is None:
        return ("auto" if tools else "none"), tools
    if tool_choice in ("none", "auto", "required"):
        if tool_choice != "none" and not tools:
            raise ValueError(f"tool_choice: {tool_choice!r} needs tools")
        return tool_choice, tools
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        named = [t for t in tools if t.name == name]
        if not named:
            raise ValueError(f"tool_choice.function.name: no tool named {name!r} in tools")
        return "named", named
    raise ValueError("tool_choice: must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                     f"\"function\": {{\"name\": ...}}}}, got {json.dumps(tool_choice)[:60]}")


def tool_constraint(mode: str, tools: list[Tool], parallel: bool) -> Constraint | None:
    """The grammar of the answer a tool choice forces (None for auto / none): Hermes blocks, one per call, whose
    JSON is {"name": one of the tools, "arguments": that tool's parameters}."""
    if mode not in ("required", "named"):
        return None
    calls = [{"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.parameters},
              "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    repeat = ' ("\\n" call)*' if parallel else ""
    grammar = (f'start: call{repeat}\ncall: {json.dumps(OPEN + chr(10))} body {json.dumps(chr(10) + CLOSE)}\n'
               f'body: %json {json.dumps(schema, ensure_ascii=False)}\n')
    if len(grammar) > MAX_CONSTRAINT_CHARS:
        raise ValueError(f"tools: their parameter schemas come to {len(grammar)} characters, more than the "
                         f"{MAX_CONSTRAINT_CHARS} a constraint may have")
    return Constraint("grammar", grammar, "tool_choice" if mode == "named" else "tools")
