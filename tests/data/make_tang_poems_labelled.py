"""Writes tang_poems_{train,validation,test}.jsonl from tang_poems.txt: every line of a poem whose clauses are all
five or all seven characters long, labelled 五言 (five-character verse) or 七言 (seven-character verse); split by
poem (every fifth poem to test, the one before it to validation). Run from the repository root."""
from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).parent


def main() -> None:
    text = (HERE / "tang_poems.txt").read_text(encoding="utf-8")
    poems = [block.strip().split("\n") for block in re.split(r"\n\s*\n", text) if block.strip()]
    splits: dict[str, list[dict[str, str]]] = {"train": [], "validation": [], "test": []}
    for i, poem in enumerate(poems):
        split = {4: "test", 3: "validation"}.get(i % 5, "train")
        for line in poem[2:]:  # after the title and the author lines
            lengths = {len(c) for c in re.split(r"[，。]", line) if c}
            label = {frozenset({5}): "五言", frozenset({7}): "七言"}.get(frozenset(lengths))
            if label is not None:
                splits[split].append({"text": line, "label": label})
    for split, rows in splits.items():
        with (HERE / f"tang_poems_{split}.jsonl").open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


if __name__ == "__main__":
    main()
