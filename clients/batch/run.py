"""The batch loop: N records in flight, answers written strictly in input order, resumable."""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from ..errors import OrtserveError
from .input import Record
from .output import OutputLog, ResumeFilter, id_key
from .tasks import Runner

# Answers that say "this run cannot work" rather than "this record is bad": the run stops (and can
# be resumed) instead of writing every remaining record as failed, which a re-run would then skip.
ABORT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED,
                         grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND,
                         grpc.StatusCode.UNIMPLEMENTED})


class RunAborted(Exception):
    """The run stopped early; what was written stays valid and a re-run resumes after it."""


@dataclass
class Counts:
    ok: int = 0
    failed: int = 0
    skipped: int = 0          # already in the output from an earlier run
    failed_before: int = 0    # failed records among the skipped ones
    started: float = field(default_factory=time.monotonic)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def summary(self, output: Any) -> str:
        done = self.ok + self.failed
        rate = done / self.elapsed if self.elapsed > 0 else 0.0
        earlier = f" ({self.failed_before} of them failed)" if self.failed_before else ""
        return (f"batch: {done} records in {self.elapsed:.1f}s ({rate:.1f} records/s): {self.ok} ok, "
                f"{self.failed} failed; {self.skipped} already in the output{earlier} -> {output}")


def error_payload(error: OrtserveError | str) -> dict[str, Any]:
    if isinstance(error, OrtserveError):
        return {"error": f"{error.code.name}: {error.message}"}
    return {"error": error}


async def _answer(runner: Runner, record: Record, slots: asyncio.Semaphore) -> dict[str, Any]:
    async with slots:
        try:
            return await runner.run(record)
        except OrtserveError as e:
            if e.code in ABORT_CODES:
                raise RunAborted(f"record {record.id!r} (input line {record.line}): {e}") from None
            return error_payload(e)


def plan(records: Iterable[Record], out: OutputLog, counts: Counts) -> Iterator[tuple[Record, dict | None]]:
    """The records still to write, in input order, each with its payload when it is already known
    (a malformed line or a repeated id fails without a model call), else None."""
    resume = ResumeFilter(out.done)
    first_line: dict[str, int] = {}
    for record in records:
        first = first_line.setdefault(id_key(record.id), record.line)
        if resume.already_written(record.id):
            counts.skipped += 1
        elif record.error is not None:
            yield record, error_payload(record.error)
        elif first != record.line:
            yield record, error_payload(f"id: duplicate of the record on input line {first}")
        else:
            yield record, None


def write_answer(out: OutputLog, counts: Counts, record: Record, payload: dict[str, Any], progress: Any) -> None:
    out.write(record.id, payload)
    if "error" in payload:
        counts.failed += 1
    else:
        counts.ok += 1
    if progress is not None:
        progress.update(1)


async def _ready(payload: dict[str, Any]) -> dict[str, Any]:
    return payload


async def run_records(records: Iterable[Record], runner: Runner, out: OutputLog, concurrency: int,
                      progress: Any = None) -> Counts:
    """Answers every record not yet in `out`, writing each answer in input order as soon as all
    records before it are written. At most 4 x concurrency records are held at once."""
    counts = Counts(failed_before=out.failed_before)
    slots = asyncio.Semaphore(concurrency)
    window: deque[tuple[Record, asyncio.Task]] = deque()
    todo = plan(records, out, counts)
    exhausted = False
    try:
        while True:
            while not exhausted and len(window) < 4 * concurrency:
                item = next(todo, None)
                if item is None:
                    exhausted = True
                    break
                record, known = item
                job = _ready(known) if known is not None else _answer(runner, record, slots)
                window.append((record, asyncio.ensure_future(job)))
            if not window:
                return counts
            record, task = window[0]
            payload = await task
            window.popleft()
            write_answer(out, counts, record, payload, progress)
    finally:
        for _, task in window:
            task.cancel()
        if window:
            await asyncio.gather(*(t for _, t in window), return_exceptions=True)
