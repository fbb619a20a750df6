"""Batch output: an append-only JSONL file that survives kill -9 and can be resumed.

Every record line is appended and flushed to the OS before the next, in input order, so after the process
dies (kill -9 included) the file holds a prefix of the full output plus at most one partial last line. The
disk itself is synced at most every FSYNC_EVERY_S and on close: fsync per answer on the event loop took most of
the loop's time in a g2p batch job (measured: bench/FINDINGS.md, "Batch output's fsync"); a machine crash can lose
the last FSYNC_EVERY_S of answers, which a resumed run recomputes (it never sees them as done). Opening it
again drops that partial line (it is not a record) and remembers which ids are done; completed
lines are never rewritten.
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .input import RecordId

log = logging.getLogger(__name__)


def id_key(record_id: RecordId) -> str:
    # "7" (a given id) and 7 (a line number) are different ids; JSON keeps them apart.
    return json.dumps(record_id)


FSYNC_EVERY_S = 0.5


class OutputLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.done: Counter[str] = Counter()  # id key -> lines already written with it
        self.failed_before = 0
        self._recover()
        self._file = open(path, "a", encoding="utf-8")
        self._synced = time.monotonic()

    def _recover(self) -> None:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        if end < len(data):
            # Only a crash in the middle of a write leaves this; the record is redone below.
            log.warning("output: dropping a partial last line (%d bytes) left by an interrupted run",
                        len(data) - end)
            with open(self.path, "r+b") as f:
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())
        for number, raw in enumerate(data[:end].splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                value = json.loads(raw)
            except ValueError:
                raise ValueError(f"output: line {number} of {self.path} is not JSON; not appending to it") from None
            if not isinstance(value, dict) or "id" not in value:
                raise ValueError(f"output: line {number} of {self.path} has no id; not appending to it")
            self.done[id_key(value["id"])] += 1
            self.failed_before += "error" in value

    @property
    def written_before(self) -> int:
        return sum(self.done.values())

    def write(self, record_id: RecordId, payload: dict[str, Any]) -> None:
        line = json.dumps({"id": record_id, **payload}, ensure_ascii=False)
        self._file.write(line + "\n")
        self._file.flush()
        now = time.monotonic()
        if now - self._synced >= FSYNC_EVERY_S:
            os.fsync(self._file.fileno())
            self._synced = now

    def close(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()


class ResumeFilter:
    """Tells which records are already in the output: the k-th record with an id is done when the
    output holds at least k lines with that id (so repeated ids resume correctly too)."""

    def __init__(self, done: Counter[str]) -> None:
        self._done = done
        self._seen: Counter[str] = Counter()

    def already_written(self, record_id: RecordId) -> bool:
        key = id_key(record_id)
        self._seen[key] += 1
        return self._seen[key] <= self._done[key]
