"""Ray Data path of the batch script (extra `ray`): the in-process runner in an actor pool.

Ray does the distribution (a local instance, or the cluster in $RAY_ADDRESS); each actor holds one
LocalRunner (one loaded model). Planning, resume and the ordered, fsync'ed output are the plain
script's own, so the output file is the same.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import asdict
from typing import Any

import numpy as np

from ..errors import OrtserveError
from .input import Record
from .output import OutputLog
from .run import Counts, RunAborted, plan, write_answer
from .tasks import TaskConfig

log = logging.getLogger(__name__)

_BATCH_ROWS = 16
_ABORT = "__abort__"


class _Worker:
    """Ray actor: one event loop and one in-process data plane for the actor's lifetime."""

    def __init__(self, repository: str, config: TaskConfig, concurrency: int) -> None:
        from .local import LocalRunner

        self.loop = asyncio.new_event_loop()
        # One onnxruntime thread per actor: the actors themselves are the parallelism.
        self.runner = self.loop.run_until_complete(LocalRunner.start(repository, config, intra_op_threads=1))
        self.slots = concurrency

    async def _answer_all(self, records: list[Record]) -> list[str]:
        from .run import ABORT_CODES, error_payload

        slots = asyncio.Semaphore(self.slots)

        async def one(record: Record) -> str:
            async with slots:
                try:
                    payload = await self.runner.run(record)
                except OrtserveError as e:
                    # A run-level failure travels back as data: a raised one would arrive wrapped
                    # in Ray's multi-line task error.
                    payload = {_ABORT: str(e)} if e.code in ABORT_CODES else error_payload(e)
            return json.dumps(payload)

        return await asyncio.gather(*(one(r) for r in records))

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        records = [Record(**json.loads(r)) for r in batch["record"]]
        payloads = self.loop.run_until_complete(self._answer_all(records))
        return {"position": batch["position"], "payload": np.array(payloads, dtype=object)}


def run_with_ray(config: Any, out: OutputLog, progress: Any) -> Counts:
    """config: batch.BatchConfig with local_repository and ray_workers set."""
    import ray
    import ray.data

    from .input import read_records

    counts = Counts(failed_before=out.failed_before)
    todo = list(plan(read_records(config.input, config.format, config.task.task), out, counts))
    # Records go to Ray as JSON strings: ids may mix ints and strings, which one Arrow column cannot hold.
    rows = [{"position": i, "record": json.dumps(asdict(r))} for i, (r, known) in enumerate(todo) if known is None]
    started_here = not ray.is_initialized()
    if started_here:
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False, logging_level=logging.WARNING)
        else:
            ray.init(num_cpus=config.ray_workers, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING, object_store_memory=200 * 1024 * 1024)
    answers: Any = iter(())
    try:
        if rows:
            context = ray.data.DataContext.get_current()
            context.execution_options.preserve_order = True  # answers come back in input order
            context.enable_progress_bars = False  # ours counts written records
            dataset = ray.data.from_items(rows).map_batches(
                _Worker, fn_constructor_args=(str(config.local_repository), config.task, config.concurrency),
                batch_size=_BATCH_ROWS, compute=ray.data.ActorPoolStrategy(size=config.ray_workers), num_cpus=1)
            answers = iter(dataset.iter_rows())
        for i, (record, known) in enumerate(todo):
            if known is None:
                row = next(answers)
                if row["position"] != i:
                    raise RuntimeError(f"ray returned record {row['position']} where {i} was expected")
                known = json.loads(row["payload"])
                if _ABORT in known:
                    raise RunAborted(f"record {record.id!r} (input line {record.line}): {known[_ABORT]}")
            write_answer(out, counts, record, known, progress)
    finally:
        close = getattr(answers, "close", None)
        if close is not None:
            close()  # before shutdown: a live iterator would report to a stopped cluster
        if started_here:
            ray.shutdown()
    return counts
