"""Batch input: JSONL, CSV or plain text, one record a line, parsed lazily.

A record's id is its "id" field when given, else its 1-based line number. A line that cannot be
parsed is still a record: it carries `error` and the run writes it as a failed record.
"""
from __future__ import annotations

import csv
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

log = logging.getLogger(__name__)

RecordId = Union[str, int]
FORMATS = ("jsonl", "csv", "text")
# Field names accepted for the main text, by task (the first present wins).
_TEXT_FIELDS = {"classify": ("text",), "fill-mask": ("text",), "generate": ("prompt", "text")}
_PAIR_FIELDS = ("text_pair", "pair")


@dataclass(frozen=True)
class Record:
    line: int                     # 1-based line of the input where the record starts
    id: RecordId
    text: str = ""
    text_pair: str | None = None  # classify only
    error: str | None = None      # set when the line is malformed


def detect_format(path: Path, given: str | None) -> str:
    if given and given != "auto":
        if given not in FORMATS:
            raise ValueError(f"format: expected one of {', '.join(FORMATS)}, got {given!r}")
        return given
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if suffix in (".csv", ".tsv"):
        return "csv"
    return "text"


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) and value != "" or isinstance(value, int) and not isinstance(value, bool)


def _lone_surrogate(text: str) -> str | None:
    """A JSON string may escape half of a UTF-16 pair ("\\ud800"); such a string has no UTF-8 form, so it can be
    neither sent nor written back: the record fails naming it instead of the whole run."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"U+{ord(text[e.start]):04X} at character {e.start}"
    return None


def _from_fields(fields: dict[str, Any], line: int, task: str) -> Record:
    """A record from a JSON object or a CSV row; the first problem found becomes its error."""
    record_id = fields.get("id")
    if record_id is None or record_id == "":
        record_id = line
    elif not _valid_id(record_id):
        return Record(line=line, id=line, error=f"id: must be a non-empty string or an integer, got {record_id!r}")
    elif isinstance(record_id, str) and (where := _lone_surrogate(record_id)):
        return Record(line=line, id=line, error=f"id: a lone UTF-16 surrogate ({where}) is not text")
    names = _TEXT_FIELDS[task]
    present = [n for n in names if fields.get(n) is not None]
    if not present:
        return Record(line=line, id=record_id, error=f"{names[0]}: missing")
    text = fields[present[0]]
    if not isinstance(text, str):
        return Record(line=line, id=record_id, error=f"{present[0]}: must be a string, got {type(text).__name__}")
    if where := _lone_surrogate(text):
        return Record(line=line, id=record_id, error=f"{present[0]}: a lone UTF-16 surrogate ({where}) is not text")
    pair = None
    if task == "classify":
        pair_names = [n for n in _PAIR_FIELDS if fields.get(n) not in (None, "")]
        if pair_names:
            pair = fields[pair_names[0]]
            if not isinstance(pair, str):
                return Record(line=line, id=record_id,
                              error=f"{pair_names[0]}: must be a string, got {type(pair).__name__}")
            if where := _lone_surrogate(pair):
                return Record(line=line, id=record_id,
                              error=f"{pair_names[0]}: a lone UTF-16 surrogate ({where}) is not text")
    return Record(line=line, id=record_id, text=text, text_pair=pair)


def _lines(path: Path) -> Iterator[tuple[int, str | None]]:
    """(line number, text) of the non-blank lines; text None when the line is not UTF-8."""
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                yield line_no, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                yield line_no, None


def _not_utf8(line_no: int) -> Record:
    return Record(line=line_no, id=line_no, error=f"input line {line_no}: not valid UTF-8")


def _jsonl(path: Path, task: str) -> Iterator[Record]:
    for line_no, line in _lines(path):
        if line is None:
            yield _not_utf8(line_no)
            continue
        try:
            value = json.loads(line)
        except ValueError as e:
            yield Record(line=line_no, id=line_no, error=f"input line {line_no}: not valid JSON ({e})")
            continue
        except RecursionError:     # the json module parses nesting by recursion
            yield Record(line=line_no, id=line_no, error=f"input line {line_no}: not valid JSON (nested too deeply)")
            continue
        if not isinstance(value, dict):
            yield Record(line=line_no, id=line_no,
                         error=f"input line {line_no}: expected a JSON object, got {type(value).__name__}")
            continue
        yield _from_fields(value, line_no, task)


def _text(path: Path) -> Iterator[Record]:
    for line_no, line in _lines(path):
        yield _not_utf8(line_no) if line is None else Record(line=line_no, id=line_no, text=line)


def _csv(path: Path, task: str) -> Iterator[Record]:
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    # Undecodable bytes become U+FFFD here: a CSV record may span lines, so it cannot be skipped alone.
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        reader = csv.reader(f, delimiter=delimiter, strict=True)
        try:
            header = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise ValueError(f"input: unreadable CSV header ({e})") from None
        known = {*_TEXT_FIELDS[task], *(_PAIR_FIELDS if task == "classify" else ())}
        if not known & set(header):
            raise ValueError(f"input: the CSV header needs a {' or '.join(_TEXT_FIELDS[task])!r} column, "
                             f"got {header}")
        while True:
            line_no = reader.line_num + 1
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                yield Record(line=line_no, id=line_no, error=f"input line {line_no}: malformed CSV ({e})")
                continue
            if not row or not any(cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                yield Record(line=line_no, id=line_no,
                             error=f"input line {line_no}: expected {len(header)} CSV fields, got {len(row)}")
                continue
            yield _from_fields(dict(zip(header, row)), line_no, task)


def read_records(path: Path, fmt: str, task: str) -> Iterator[Record]:
    if fmt == "jsonl":
        return _jsonl(path, task)
    if fmt == "csv":
        return _csv(path, task)
    return _text(path)


def count_records(path: Path, fmt: str, task: str) -> int:
    """Records in the input (a first, cheap pass so the progress bar has a total)."""
    if fmt == "csv":
        return sum(1 for _ in _csv(path, task))
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())
