"""Chat messages -> one prompt, with the package's chat template (a Jinja template, as Hugging Face tokenizers
carry in tokenizer_config.json; the exporter copies it into model.json as `chat_template`).

Rendered in Jinja's sandbox with the variables HF templates use: messages, tools (OpenAI's tool definitions, as
transformers' apply_chat_template(tools=...) passes them; absent without tools), add_generation_prompt, bos_token,
eos_token, raise_exception(), and transformers' `tojson` (plain JSON: Jinja's own escapes <, > and & for HTML,
which would change the tool calls a template writes). The data plane renders with the template of the version it leased for the
request (DataPlane.chat / chat_streams), so the version that generates is the one whose template made the prompt.
"""
from __future__ import annotations

import functools
import json
from typing import Any

from server.protocol.errors import ServingError
from server.protocol.types import ChatTemplate


class _TemplateError(Exception):
    pass


def _raise(message: str) -> None:
    raise _TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@functools.lru_cache(maxsize=32)
def _compile(template: str) -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.filters["tojson"] = _tojson
    return env.from_string(template)


def render_chat(template: str, messages: list[dict[str, Any]], special: dict[str, str] | None = None,
                tools: list[dict[str, Any]] | None = None) -> str:
    """The prompt for `messages` (and `tools`), ending where the assistant's answer starts; INVALID_ARGUMENT on a
    template that refuses the conversation (e.g. roles out of order)."""
    from jinja2 import TemplateError

    extra = {"tools": tools} if tools else {}
    try:
        return str(_compile(template).render(messages=messages, add_generation_prompt=True, **(special or {}),
                                             **extra))
    except _TemplateError as exc:
        raise ServingError.invalid("messages", str(exc)) from None
    except TemplateError as exc:
        raise ServingError.invalid("model", f"its chat template fails to render: {exc}") from None


def chat_prompt(template: ChatTemplate | None, model: str, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None = None) -> str:
    """The prompt of a chat request to `model` whose package carries `template`; INVALID_ARGUMENT naming `model`
    when it carries none."""
    if template is None:
        raise ServingError.invalid("model", f"{model!r} has no chat template (its package's tokenizer carries "
                                            f"none): use /v1/completions with a prompt")
    return render_chat(template.template, messages, template.variables, tools)
