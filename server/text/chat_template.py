"""Chat messages -> one prompt, with the package's chat template (a Jinja template, as Hugging Face tokenizers
carry in tokenizer_config.json; the exporter copies it into model.json as `chat_template`).

Rendered in Jinja's sandbox with the variables HF templates use: messages, add_generation_prompt, bos_token,
eos_token, and raise_exception(). The data plane renders with the template of the version it leased for the
request (DataPlane.chat / chat_streams), so the version that generates is the one whose template made the prompt.
"""
from __future__ import annotations

import functools
from typing import Any

from server.protocol.errors import ServingError
from server.protocol.types import ChatTemplate


class _TemplateError(Exception):
    pass


def _raise(message: str) -> None:
    raise _TemplateError(message)


@functools.lru_cache(maxsize=32)
def _compile(template: str) -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    return env.from_string(template)


def render_chat(template: str, messages: list[dict[str, str]], special: dict[str, str] | None = None) -> str:
    """The prompt for `messages`, ending where the assistant's answer starts; INVALID_ARGUMENT on a template
    that refuses the conversation (e.g. roles out of order)."""
    from jinja2 import TemplateError

    try:
        return str(_compile(template).render(messages=messages, add_generation_prompt=True, **(special or {})))
    except _TemplateError as exc:
        raise ServingError.invalid("messages", str(exc)) from None
    except TemplateError as exc:
        raise ServingError.invalid("model", f"its chat template fails to render: {exc}") from None


def chat_prompt(template: ChatTemplate | None, model: str, messages: list[dict[str, str]]) -> str:
    """The prompt of a chat request to `model` whose package carries `template`; INVALID_ARGUMENT naming `model`
    when it carries none."""
    if template is None:
        raise ServingError.invalid("model", f"{model!r} has no chat template (its package's tokenizer carries "
                                            f"none): use /v1/completions with a prompt")
    return render_chat(template.template, messages, template.variables)
