"""The one report writer: result files (JSON, written atomically: temp file, then rename) and the marked blocks of
docs/BENCHMARKS.md.

A benchmark's run writes its result document with `write_json` (or `publish`, which also renders it into its
block) and its render function turns a result into the block's Markdown lines. Blocks sit between
`<!-- NAME:begin -->` and `<!-- NAME:end -->`; `python -m bench report` rewrites the rest of the file (the suite's
own sections, bench/report.py) and keeps every block; each benchmark replaces only its own.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .config import PIECES
from .machine import describe

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "BENCHMARKS.md"
_BEGIN = re.compile(r"<!-- ([\w.:-]+):begin -->")


def write_json(path: Path, data: Any, indent: int = 2) -> None:
    write_text(path, json.dumps(data, indent=indent, sort_keys=False) + "\n")


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def load_results(out: Path) -> dict[str, dict[str, Any]]:
    """piece -> its result document, for every suite piece whose file exists in `out`."""
    found = {}
    for piece in PIECES:
        f = out / f"{piece}.json"
        if f.is_file():
            found[piece] = read_json(f)
    return found


def stamp(command: str) -> dict[str, Any]:
    """What a result records: the machine, the command and when it ran."""
    return {"machine": describe(ROOT), "command": command, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def header(result: dict[str, Any]) -> str:
    """The block's first line: the command, when, and the machine (from `stamp`)."""
    m = result["machine"]
    return (f"- Command: `{result['command']}` at {result['at']}; {m['cpu_model']}, {m['nproc']} cores, commit "
            f"{m['git_commit']}, load average at start {m['loadavg_at_start']}")


def run_header(title: str, r: dict[str, Any]) -> list[str]:
    """A block's heading and its run: the command, when it started, the machine (keys command, started, machine)."""
    m = r.get("machine", {})
    return [f"## {title}", "", f"- Command: `{r['command']}` at {r['started']}",
            f"- Machine: nproc {m.get('nproc', '?')}, {m.get('cpu_model', '?')}; load average at start "
            f"{m.get('loadavg_at_start')}; git {m.get('git_commit', '?')}"]


def table(head: list[str], rows: Any) -> list[str]:
    """A Markdown table: the head, its rule, one line per row (cells as given, str() of each)."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)]


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
    write_text(path, text)


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


def publish(result: dict[str, Any], out: Path | None, docs: Path | None, block: str,
            render: Callable[[dict[str, Any]], list[str]], indent: int = 2) -> list[str]:
    """Write the result to `out` (None: already there), its rendering into block `block` of `docs` (None: no
    report); returns the rendered lines."""
    if out is not None:
        write_json(out, result, indent)
    lines = render(result)
    if docs is not None:
        write_block(docs, block, lines)
    return lines
