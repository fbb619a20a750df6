"""What a package records from the checkpoint's tokenizer files: special token ids and the chat template."""
from __future__ import annotations

import json

from tokenizers import Tokenizer

from .source import CheckpointInfo, optional_json


def special_tokens(info: CheckpointInfo, tok: Tokenizer) -> tuple[dict[str, int | None], str | None]:
    """Ids of pad/unk/cls/sep/mask/bos/eos: tokenizer_config.json's tokens first, config.json's ids next."""
    tcfg = optional_json(info.path / "tokenizer_config.json")
    fallback = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"} \
        if info.model_type != "gpt2" else {"bos": "<|endoftext|>", "eos": "<|endoftext|>"}
    ids: dict[str, int | None] = {}
    tokens: dict[str, str | None] = {}
    for key in ("pad", "unk", "cls", "sep", "mask", "bos", "eos"):
        token = tcfg.get(f"{key}_token")
        if isinstance(token, dict):  # HF AddedToken serialisation
            token = token.get("content")
        token = token or fallback.get(key)
        tid = tok.token_to_id(token) if token else None
        if tid is None and isinstance(info.config.get(f"{key}_token_id"), int):
            tid = info.config[f"{key}_token_id"]
            token = tok.id_to_token(tid)
        ids[key], tokens[key] = tid, token if tid is not None else None
    return ids, tokens["mask"]


def chat_template(info: CheckpointInfo) -> str | None:
    """The checkpoint tokenizer's chat template (tokenizer_config.json `chat_template`, or its `default` entry
    when it lists named templates; else a chat_template.jinja file), None when it has none."""
    cfg_file = info.path / "tokenizer_config.json"
    found = None
    if cfg_file.is_file():
        try:
            found = json.loads(cfg_file.read_text(encoding="utf-8")).get("chat_template")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            found = None
    if isinstance(found, list):
        named = {t.get("name"): t.get("template") for t in found if isinstance(t, dict)}
        found = named.get("default") or next(iter(named.values()), None)
    jinja = info.path / "chat_template.jinja"
    if not found and jinja.is_file():
        found = jinja.read_text(encoding="utf-8")
    return found if isinstance(found, str) and found.strip() else None
