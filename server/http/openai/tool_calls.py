"""Tool calling on /v1/chat/completions: the request's tools and tool choice, its messages as chat templates read
them (tool calls of earlier assistant turns, `tool` results), and the answer's `tool_calls`, whole or streamed as
OpenAI streams them (one delta with the call's id, type and name, then its arguments).

The calls are Hermes blocks (server/structured/tools.py): forced by the constraint of a required or named tool
choice, found in what the model wrote with auto.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgspec

from server.protocol.errors import Code, ServingError
from server.structured import Constraint
from server.structured.hermes import HermesStream, ToolCall, parse_tool_calls
from server.structured.tools import Tool, chosen_tools, tool_constraint, tools_of
from server.http.openai.protocol import ChatCompletionRequest, ChatMessage


@dataclass(frozen=True)
class ChatTools:
    mode: str                              # none, auto, required, named
    tools: list[Tool] = field(default_factory=list)
    constraint: Constraint | None = None   # what required / named force

    @property
    def definitions(self) -> list[dict[str, Any]] | None:
        """What the chat template gets as `tools` (None: no tools, as HF templates expect)."""
        return [t.definition for t in self.tools] or None

    @property
    def parses(self) -> bool:
        return self.mode != "none"


def chat_tools(body: ChatCompletionRequest) -> ChatTools:
    """INVALID_ARGUMENT naming the field of a bad tool or tool choice."""
    try:
        tools = tools_of(None if body.tools is msgspec.UNSET else body.tools)
        mode, callable_tools = chosen_tools(tools, None if body.tool_choice is msgspec.UNSET else body.tool_choice)
        parallel = True if body.parallel_tool_calls is None else bool(body.parallel_tool_calls)
        return ChatTools(mode, tools, tool_constraint(mode, callable_tools, parallel))
    except ValueError as exc:
        raise ServingError(Code.INVALID_ARGUMENT, str(exc)) from None


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The messages as HF chat templates read them: role and text content; an assistant's tool calls with their
    arguments as objects (templates write them with tojson); a tool result's tool_call_id and name."""
    if not messages:
        raise ServingError.invalid("messages", "must not be empty")
    out = []
    for i, m in enumerate(messages):
        message: dict[str, Any] = {"role": m.role, "content": _text(m.content, i)}
        if m.tool_calls:
            message["tool_calls"] = _calls(m.tool_calls, i)
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            message["name"] = m.name
        out.append(message)
    return out


def _text(content: Any, i: int) -> str:
    if not isinstance(content, list):
        return content or ""
    parts = []
    for j, p in enumerate(content):     # [{"type": "text", "text": ...}, ...]
        if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
            raise ServingError.invalid(f"messages[{i}].content[{j}]", "only text parts are supported")
        parts.append(p["text"])
    return "".join(parts)


def _calls(calls: Any, i: int) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise ServingError.invalid(f"messages[{i}].tool_calls", "must be a list of tool calls")
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ServingError.invalid(f"messages[{i}].tool_calls[{j}].function", "must have a name")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                raise ServingError.invalid(f"messages[{i}].tool_calls[{j}].function.arguments",
                                           "must be JSON text") from None
        out.append({"id": call.get("id"), "type": "function",
                    "function": {"name": function["name"], "arguments": arguments}})
    return out


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def answer_message(text: str, finish: str, tools: ChatTools) -> tuple[dict[str, Any], str]:
    """The assistant message of a whole answer and its finish reason ("tool_calls" when it calls tools)."""
    if not tools.parses:
        return {"role": "assistant", "content": text}, finish
    content, calls = parse_tool_calls(text)
    if not calls:
        return {"role": "assistant", "content": text}, finish
    return {"role": "assistant", "content": content or None,
            "tool_calls": [{"id": _call_id(), "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments}} for c in calls]}, "tool_calls"


class ToolDeltas:
    """One streamed choice's deltas: content as it comes, each call once its block closes."""

    def __init__(self) -> None:
        self._stream, self.calls = HermesStream(), 0

    def deltas(self, text: str, final: bool) -> list[dict[str, Any]]:
        events = self._stream.feed(text) + (self._stream.finish() if final else [])
        out: list[dict[str, Any]] = []
        for kind, value in events:
            if kind == "content":
                if not (self.calls and not str(value).strip()):   # the blanks between calls are not content
                    out.append({"content": value})
                continue
            call: ToolCall = value    # type: ignore[assignment]
            out.append({"tool_calls": [{"index": self.calls, "id": _call_id(), "type": "function",
                                        "function": {"name": call.name, "arguments": ""}}]})
            out.append({"tool_calls": [{"index": self.calls, "function": {"arguments": call.arguments}}]})
            self.calls += 1
        return out
