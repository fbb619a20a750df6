"""The in-process runner over several processes (`ortserve-batch --local REPO --processes N`).

One interpreter runs one Python thread at a time: with --local, the event loop (admission, output processing) and
the engines' worker threads (everything around the onnxruntime calls) of one process take turns on that lock, so a
small model's batch job leaves cores idle however many engines it has. Here each of N processes holds its own
LocalRunner (its own event loop, data plane and engines, onnxruntime threads = its share of the cores), and records
go to the process with the fewest in flight. The answers are the same payloads a single --local run writes; run.py
still orders, writes and resumes them.

Each pipe end is read by a thread of its own that does nothing else, so neither side's send can wait on a reader
that is itself sending. A record's answer, or its OrtserveError (code and message), comes back as data; a process
that dies fails what it held with UNAVAILABLE, which stops the run (run.ABORT_CODES) so a re-run resumes it.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import os
import signal
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc

from ..errors import OrtserveError
from .input import Record
from .tasks import TaskConfig

log = logging.getLogger(__name__)

# Messages, parent -> child: a list of (key, Record), or None (finish and exit). Child -> parent: ("ready", None),
# ("failed", (kind, text)) at start, then lists of (key, payload dict | None, (code name, message) | None).
_STOP = None


def _child(conn: Connection, repository: str, config: TaskConfig, options: dict[str, Any]) -> None:
    """A process's life: start its runner, answer what arrives until told to stop (or the parent goes away).
    Ctrl-C reaches the whole process group: the parent answers it (and stops the children), so a child ignores it
    rather than print a traceback of its own."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(_serve(conn, repository, config, options))


async def _serve(conn: Connection, repository: str, config: TaskConfig, options: dict[str, Any]) -> None:
    """options: LocalRunner.start's keyword arguments."""
    from .local import LocalRunner   # the server package: imported in the child only

    try:
        runner = await LocalRunner.start(Path(repository), config, **options)
    except Exception as e:   # reported to the parent, which raises it where the command can say it in one line
        conn.send(("failed", ("ValueError" if isinstance(e, ValueError) else type(e).__name__, str(e))))
        return
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    answers: list[tuple[int, dict[str, Any] | None, tuple[str, str] | None]] = []

    def flush() -> None:
        batch, answers[:] = list(answers), []
        conn.send(batch)

    async def answer(key: int, record: Record) -> None:
        try:
            item = (key, await runner.run(record), None)
        except OrtserveError as e:
            item = (key, None, (e.code.name, e.message))
        except Exception as e:     # a failure of ours, not the record's: it must still reach the parent, which
            # would otherwise wait for this answer forever; the record fails INTERNAL, naming it
            log.exception("batch process: record %r failed", record.id)
            item = (key, None, ("INTERNAL", f"{type(e).__name__}: {e}"))
        if not answers:
            loop.call_soon(flush)      # every answer of this turn of the loop in one message
        answers.append(item)

    tasks: set[asyncio.Task] = set()

    def arrived(message: Any) -> None:
        if message is _STOP:
            done.set()
            return
        for key, record in message:
            task = loop.create_task(answer(key, record))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    def read() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):      # the parent went away: nobody will read the answers
                message = _STOP
            loop.call_soon_threadsafe(arrived, message)
            if message is _STOP:
                return

    threading.Thread(target=read, name="batch-child-reader", daemon=True).start()
    conn.send(("ready", None))
    try:
        await done.wait()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await runner.close()


def engine_threads(processes: int, instances: int, cores: int | None = None) -> int:
    """onnxruntime threads per engine when N processes of `instances` engines share `cores` (default: this
    process's), at least 1; within one process the server shares them out the same way
    (server/runtime_config.intra_op_threads)."""
    return max(1, (cores or len(os.sched_getaffinity(0))) // (processes * instances))


class _Process:
    """The parent's side of one child: its pipe, its records in flight, the records to send this turn."""

    def __init__(self, index: int, process: multiprocessing.process.BaseProcess, conn: Connection) -> None:
        self.index, self.process, self.conn = index, process, conn
        self.pending: dict[int, asyncio.Future] = {}
        self.outbox: list[tuple[int, Record]] = []
        self.lost: str | None = None     # why it can take no more records


class ProcessRunner:
    """Runner (tasks.Runner) over N child processes, each with a LocalRunner of the same repository."""

    def __init__(self, children: list[_Process], loop: asyncio.AbstractEventLoop) -> None:
        self._children, self._loop = children, loop
        self._keys = itertools.count()
        self._flushing = False
        self._closing = False    # the children are told to exit: their pipes' ends are no news
        for child in children:
            threading.Thread(target=self._read, args=(child,), name=f"batch-process-{child.index}",
                             daemon=True).start()

    @classmethod
    async def start(cls, repository: Path, config: TaskConfig, processes: int, instances: int = 1,
                    max_sequences: int | None = None, intra_op_threads: int = 0,
                    variant: str | None = None, max_queued_requests: int | None = None) -> "ProcessRunner":
        """N processes, each loading `repository` (LocalRunner.start's options); onnxruntime threads per engine:
        intra_op_threads, or the cores shared out (cores / (processes x instances), at least 1). ValueError (from
        the first child that could not start: its LocalRunner's own message) when the repository cannot be served."""
        if processes < 1:
            raise ValueError(f"processes: must be at least 1, got {processes}")
        threads = intra_op_threads or engine_threads(processes, instances)
        options = {"intra_op_threads": threads, "instances": instances, "max_sequences": max_sequences,
                   "variant": variant, "max_queued_requests": max_queued_requests, "processes": processes}
        # spawn, not fork: a forked child would inherit this process's threads' locks half-held.
        context = multiprocessing.get_context("spawn")
        children: list[_Process] = []
        loop = asyncio.get_running_loop()
        try:
            for i in range(processes):
                ours, theirs = context.Pipe()
                process = context.Process(target=_child, name=f"ortserve-batch-{i}", daemon=True,
                                          args=(theirs, str(repository), config, options))
                process.start()
                theirs.close()
                children.append(_Process(i, process, ours))
            for child in children:
                try:
                    kind, detail = await loop.run_in_executor(None, child.conn.recv)
                except (EOFError, OSError):
                    raise RuntimeError(f"processes: batch process {child.index} exited while loading "
                                       f"(exit code {child.process.exitcode})") from None
                if kind == "failed":
                    error, text = detail
                    raise (ValueError if error == "ValueError" else RuntimeError)(text)
        except BaseException:
            _stop(children)
            raise
        log.info("batch: %d processes of %d engine(s) x %d onnxruntime thread(s) each", processes, instances, threads)
        return cls(children, loop)

    async def run(self, record: Record) -> dict[str, Any]:
        live = [c for c in self._children if c.lost is None]
        if not live:
            raise OrtserveError(grpc.StatusCode.UNAVAILABLE, self._children[0].lost or "no batch process")
        child = min(live, key=lambda c: len(c.pending) + len(c.outbox))
        key = next(self._keys)
        future = self._loop.create_future()
        child.pending[key] = future
        child.outbox.append((key, record))
        if not self._flushing:
            self._flushing = True
            self._loop.call_soon(self._flush)    # every record of this turn of the loop in one message a child
        try:
            return await future
        finally:
            child.pending.pop(key, None)

    def _flush(self) -> None:
        self._flushing = False
        for child in self._children:
            if child.outbox and child.lost is None:
                batch, child.outbox = child.outbox, []
                try:
                    child.conn.send(batch)
                except OSError as e:
                    self._lose(child, f"batch process {child.index}: {e}")

    def _read(self, child: _Process) -> None:
        """Thread: the child's answers, handed to the event loop as they come."""
        while True:
            try:
                message = child.conn.recv()
            except (EOFError, OSError):
                if self._closing:
                    return
                child.process.join(timeout=5)
                self._call(self._lose, child, f"batch process {child.index} exited (exit code "
                                              f"{child.process.exitcode})")
                return
            self._call(self._answer, child, message)

    def _call(self, fn: Any, *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:      # the loop is closed: the run is over
            pass

    @staticmethod
    def _answer(child: _Process, answers: list) -> None:
        for key, payload, error in answers:
            future = child.pending.get(key)
            if future is None or future.done():     # its record's task was cancelled meanwhile
                continue
            if error is None:
                future.set_result(payload)
            else:
                code, text = error
                future.set_exception(OrtserveError(getattr(grpc.StatusCode, code, grpc.StatusCode.UNKNOWN), text))

    @staticmethod
    def _lose(child: _Process, why: str) -> None:
        if child.lost is not None:
            return
        child.lost = why
        log.error("%s; its %d records in flight fail UNAVAILABLE", why, len(child.pending))
        for future in child.pending.values():
            if not future.done():
                future.set_exception(OrtserveError(grpc.StatusCode.UNAVAILABLE, why))
        child.outbox.clear()

    async def close(self) -> None:
        self._closing = True
        await self._loop.run_in_executor(None, _stop, self._children)


def _stop(children: list[_Process]) -> None:
    """Ask each child to finish, wait for it a while, then end it."""
    for child in children:
        try:
            child.conn.send(_STOP)
        except OSError:
            pass
    for child in children:
        child.process.join(timeout=30)
        if child.process.is_alive():
            child.process.kill()
            child.process.join()
        child.conn.close()
