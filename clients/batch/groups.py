"""Generation records that reach the in-process runner in one turn of the event loop, admitted as one request.

A batch job keeps hundreds of records in flight and sends the next ones as answers come back, so several arrive
together after every decode step. Admitting them with one DataPlane.generate_many instead of one generate each
costs the engine's admission (its lease, queue check and scheduler hand-off) once per group (bench/FINDINGS.md).
generate_many is all or nothing — one refused prompt refuses the group, one failure cancels the rest — which a
batch job must not be: a group refused or failed as a whole runs again record by record, so a bad record answers
its own error and every other record its answer."""
from __future__ import annotations

import asyncio
from typing import Any

# A group's size is at most this: one refusal or failure costs at most this many records a second admission.
MAX_GROUP = 64


class AdmissionGroups:
    def __init__(self, plane: Any, model: str, version: int, limit: int = MAX_GROUP) -> None:
        self.plane, self.model, self.version, self.limit = plane, model, version, limit
        self._pending: list[tuple[str, Any, asyncio.Future]] = []
        self._running: set[asyncio.Task] = set()

    async def generate(self, text: str, params: Any) -> Any:
        """The record's GenerateResult (DataPlane.generate's), or its own error."""
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        self._pending.append((text, params, answer))
        if len(self._pending) >= self.limit:
            self._flush()
        elif len(self._pending) == 1:
            loop.call_soon(self._flush)      # after every record of this turn has joined
        return await answer

    def close(self) -> None:
        """Stop the groups still running and the records not yet in one (the runner is closing): a caller still
        waiting on one of them is cancelled, not left waiting."""
        for _, _, answer in self._pending:
            answer.cancel()
        self._pending = []
        for task in self._running:
            task.cancel()

    def _flush(self) -> None:
        group, self._pending = self._pending, []
        if group:
            task = asyncio.get_running_loop().create_task(self._admit(group))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _admit(self, group: list[tuple[str, Any, asyncio.Future]]) -> None:
        try:
            await self._answer(group)
        except asyncio.CancelledError:     # close(): whoever still waits on a record of the group is cancelled too
            for _, _, answer in group:
                answer.cancel()
            raise

    async def _answer(self, group: list[tuple[str, Any, asyncio.Future]]) -> None:
        if len(group) > 1:
            try:
                results = await self.plane.generate_many(self.model, self.version, [(t, p) for t, p, _ in group])
            except Exception:      # refused or failed as a group (asyncio.CancelledError is not one): one by one
                pass
            else:
                for (_, _, answer), result in zip(group, results):
                    if not answer.done():
                        answer.set_result(result)
                return
        await asyncio.gather(*(self._one(text, params, answer) for text, params, answer in group))

    async def _one(self, text: str, params: Any, answer: asyncio.Future) -> None:
        try:
            result = await self.plane.generate(self.model, self.version, text, params)
        except Exception as error:
            if not answer.done():
                answer.set_exception(error)
        else:
            if not answer.done():
                answer.set_result(result)
