"""User data files: pre-training text, labelled JSONL / CSV (errors name the file, line and field), and the
JSONL writer of labelled examples."""
from __future__ import annotations

import csv
import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

from training.errors import DataError


@dataclass
class Example:
    """One labelled example (the label is a string from the label set)."""

    text: str
    label: str
    text_pair: str | None = None
    source: str | None = None  # play (default data) or "file:line"


def read_corpus(paths: Sequence[str | os.PathLike]) -> list[str]:
    """User pre-training text: files or directories of *.txt; one document per blank-line block."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.txt"))
            if not found:
                raise DataError(f"{p}: corpus: no .txt files in directory")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise DataError(f"{p}: corpus: file not found")
    docs: list[str] = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"{f}: corpus: cannot read ({type(exc).__name__})") from exc
        blocks = [b.strip() for b in re.split(r"\n\s*\n", text) if b.strip()]
        if not blocks:
            raise DataError(f"{f}: corpus: file is empty")
        docs += blocks
    return docs


def read_labelled(path: str | os.PathLike, labels: Sequence[str] | None = None) -> list[Example]:
    """Read a JSONL or CSV file with `text`, optional `text_pair`, and `label`.

    With `labels`, every label must be in that set; errors name the file, line and field.
    """
    p, raw = read_data_file(path)
    rows = _csv_rows(p, raw) if p.suffix.lower() == ".csv" else jsonl_rows(p, raw)
    known = set(labels) if labels is not None else None
    out: list[Example] = []
    for lineno, row in rows:
        where = f"{p}:{lineno}"
        text = row.get("text")
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{where}: field 'text': missing or empty")
        pair = row.get("text_pair")
        if pair is not None and not isinstance(pair, str):
            raise DataError(f"{where}: field 'text_pair': must be a string")
        if pair is not None and not pair.strip():
            pair = None
        label = row.get("label")
        if isinstance(label, bool) or not isinstance(label, (str, int)) or str(label).strip() == "":
            raise DataError(f"{where}: field 'label': missing or not a string/integer")
        label = str(label).strip()
        if known is not None and label not in known:
            raise DataError(f"{where}: field 'label': unknown label {label!r} (known: {', '.join(sorted(known))})")
        out.append(Example(text=text, label=label, text_pair=pair, source=where))
    if not out:
        raise DataError(f"{p}: file has no examples")
    return out


def read_data_file(path: str | os.PathLike) -> tuple[Path, str]:
    """(path, UTF-8 text) of a user data file; a DataError naming the file when it is missing or unreadable."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: file not found")
    try:
        return p, p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{p}: cannot read ({type(exc).__name__})") from exc


def jsonl_rows(p: Path, raw: str) -> list[tuple[int, dict]]:
    """(line number, object) of every non-blank line of JSONL text; DataError naming `p:line` otherwise."""
    rows = []
    for i, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{p}:{i}: bad JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise DataError(f"{p}:{i}: expected a JSON object per line")
        rows.append((i, obj))
    return rows


def _csv_rows(p: Path, raw: str) -> list[tuple[int, dict]]:
    reader = csv.DictReader(raw.splitlines())
    header = reader.fieldnames or []
    for col in ("text", "label"):
        if col not in header:
            raise DataError(f"{p}:1: field '{col}': column missing from the CSV header")
    rows = []
    try:
        for row in reader:
            if not any((v or "").strip() for k, v in row.items() if k is not None):
                continue
            rows.append((reader.line_num, {k: v for k, v in row.items() if k is not None}))
    except csv.Error as exc:
        raise DataError(f"{p}:{reader.line_num}: bad CSV ({exc})") from exc
    return rows


def label_set(train: Sequence[Example], labels: Sequence[str] | None = None) -> list[str]:
    """The label order of a classifier: --labels as given, else the train file's labels, sorted."""
    if labels:
        return list(labels)
    return sorted({e.label for e in train})


def write_jsonl(examples: Iterable[Example], path: str | os.PathLike) -> Path:
    """Write examples as JSONL atomically (temp file, then rename)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{p.name}-", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for e in examples:
                row = {k: v for k, v in asdict(e).items() if v is not None}
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p
