"""Tool calls found in what a model wrote, in Hermes' format (tools.py): whole, and as a stream arrives.

A block is a call when its JSON is an object with a string "name" and "arguments" (an object, or JSON text);
anything else, and a block the answer never closed, stays content.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .tools import CLOSE, OPEN

_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str      # JSON text, as OpenAI's answers carry it


def call_of(block: str) -> ToolCall | None:
    """The call a block's inner text writes, or None."""
    try:
        value = json.loads(block)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """(the content besides the calls, stripped; the calls in order)."""
    calls: list[ToolCall] = []
    content: list[str] = []
    last = 0
    for match in _BLOCK.finditer(text):
        call = call_of(match.group(1))
        if call is None:
            continue
        content.append(text[last:match.start()])
        calls.append(call)
        last = match.end()
    content.append(text[last:])
    return "".join(content).strip(), calls


class HermesStream:
    """Deltas of a streamed answer: `feed(text)` gives ("content", text) and ("call", ToolCall) events as soon as
    they are sure. Text that might begin a block is held back until it does or cannot; a block's text until it
    closes."""

    def __init__(self) -> None:
        self._pending = ""

    def feed(self, text: str) -> list[tuple[str, object]]:
        self._pending += text
        events: list[tuple[str, object]] = []
        while self._pending:
            start = self._pending.find(OPEN)
            if start < 0:
                keep = _partial_suffix(self._pending, OPEN)
                if len(self._pending) > keep:
                    events.append(("content", self._pending[:len(self._pending) - keep]))
                    self._pending = self._pending[len(self._pending) - keep:]
                break
            if start > 0:
                events.append(("content", self._pending[:start]))
                self._pending = self._pending[start:]
            end = self._pending.find(CLOSE)
            if end < 0:
                break
            block = self._pending[:end + len(CLOSE)]
            self._pending = self._pending[len(block):]
            call = call_of(block[len(OPEN):-len(CLOSE)])
            events.append(("content", block) if call is None else ("call", call))
        return events

    def finish(self) -> list[tuple[str, object]]:
        """What is left (an unfinished block): content."""
        rest, self._pending = self._pending, ""
        return [("content", rest)] if rest else []


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
