"""`prompt_name` of an embedding request: a sentence-transformers model's named prompts.

The package records the model's prompts and its default (model.json `embedding.prompts`,
`embedding.default_prompt_name`, from config_sentence_transformers.json). As `SentenceTransformer.encode` does,
the named prompt's text is prepended to every input before tokenizing; with no name the default applies (none:
the texts as they are). An unknown name is refused naming `prompt_name` and listing the known ones, before
anything is computed.
"""
from __future__ import annotations

from typing import Any

from server.protocol.errors import ServingError


def _block(extra: dict[str, Any]) -> dict[str, Any]:
    block = extra.get("embedding")
    return block if isinstance(block, dict) else {}


def prompt_text(name: str, extra: dict[str, Any], asked: str | None) -> str:
    """The text to prepend for `asked` (None: the model's default prompt, or nothing)."""
    block = _block(extra)
    prompts = block.get("prompts") if isinstance(block.get("prompts"), dict) else {}
    if asked is None:
        default = block.get("default_prompt_name")
        return str(prompts.get(default, "")) if isinstance(default, str) else ""
    if asked not in prompts:
        known = ", ".join(sorted(prompts)) or "none"
        raise ServingError.invalid("prompt_name", f"{asked!r} is not a prompt of {name!r} (known: {known})")
    return str(prompts[asked])


def with_prompt(texts: list[str], prefix: str) -> list[str]:
    return [prefix + t for t in texts] if prefix else texts
