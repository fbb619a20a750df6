"""Marked blocks of docs/BENCHMARKS.md: sections written by their own benchmark runs (bench.generation,
bench.http) between `<!-- NAME:begin -->` and `<!-- NAME:end -->`. `python -m bench report` rewrites the rest
of the file and keeps every block; each benchmark replaces only its own."""
from __future__ import annotations

import os
import re
from pathlib import Path

_BEGIN = re.compile(r"<!-- ([\w.:-]+):begin -->")


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def write_block(path: Path, name: str, lines: list[str]) -> None:
    """Replace (or append) block `name` with these lines (without markers); temp file, then rename."""
    begin, end = markers(name)
    text = path.read_text(encoding="utf-8") if path.is_file() else "# Benchmarks\n"
    block = "\n".join([begin, *lines, end])
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def existing_blocks(path: Path) -> str:
    """Every marked block of an existing report, in order, markers included."""
    if not path.is_file():
        return ""
    text = path.read_text(encoding="utf-8")
    blocks = []
    for name in _BEGIN.findall(text):
        begin, end = markers(name)
        if end in text:
            blocks.append(begin + text.split(begin, 1)[1].split(end, 1)[0] + end)
    return "\n\n".join(blocks)
