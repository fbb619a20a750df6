"""Apply a punctuation-and-casing model's answer to its text (the default token-classification model's labels:
`Cap` = capital first letter, `COMMA` / `PERIOD` / `QUESTION` / `EXCLAIM` = the mark after the word, joined by
`+`; `O` = leave the word as it is).

Ask the server for aggregation_strategy "first" (one entity per word: its first sub-token's label) and the
default ignore_labels (words labelled `O` are left out); the entities' character offsets place the edits.
"""
from __future__ import annotations

from collections.abc import Sequence

from .types import TokenEntity

MARKS = {"COMMA": ",", "PERIOD": ".", "QUESTION": "?", "EXCLAIM": "!"}


def restore_text(text: str, entities: Sequence[TokenEntity]) -> str:
    """`text` with each entity's word capitalised and/or followed by its mark; the rest unchanged."""
    out: list[str] = []
    at = 0
    for e in sorted(entities, key=lambda e: e.start):
        if e.start < at:
            continue   # overlapping spans do not come from one aggregation; keep the first
        parts = e.label.removeprefix("B-").split("+")
        word = text[e.start:e.end]
        if "Cap" in parts:
            word = word[:1].upper() + word[1:]
        out.append(text[at:e.start] + word + "".join(MARKS[p] for p in parts if p in MARKS))
        at = e.end
    out.append(text[at:])
    return "".join(out)
