"""The request-facing side of admitted sequences: their chunks as streams, or collected into whole results.

Each sequence has its own queue of chunks (sequence.py); these read them. Whatever reads a sequence frees it when
it stops early — closed, cancelled or failed — through `abandon` (admission.Admission.abandon), so a consumer that
went away never leaves its slot generating for nobody.
"""
from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Awaitable, Callable

from .admission import Job
from .params import GenerationParams
from .results import GenerationResult, StreamChunk
from .sequence import Sequence

Abandon = Callable[[Sequence], None]
Admit = Callable[..., Awaitable[list[Sequence]]]    # admission.Admission.admit


async def stream_one(admit: Admit, abandon: Abandon, prompt: str | list[int], params: GenerationParams,
                     deadline: float | None) -> AsyncIterator[StreamChunk]:
    """One job's chunks as tokens are produced (GenerationEngine.stream); the last one has final=True."""
    refuse_streamed_beams([(prompt, params)])
    [seq] = await admit([(prompt, params)], deadline)
    try:
        while True:
            chunk = await seq.next_chunk()
            yield chunk
            if chunk.final:
                return
    finally:
        # Closed early, cancelled, or failed: free the slot now (not when the generator is collected).
        if not seq.done:
            abandon(seq)


async def collect(seq: Sequence, abandon: Abandon) -> GenerationResult:
    """Every chunk of an admitted sequence, as one result; cancelled (or failed) early, it is abandoned."""
    texts: list[str] = []
    tokens, prompt_tokens = [], []
    try:
        while True:
            chunk = await seq.next_chunk()
            texts.append(chunk.text)
            tokens.extend(chunk.tokens)
            prompt_tokens.extend(chunk.prompt_tokens)
            if chunk.final:
                break
    finally:
        if not seq.done:
            abandon(seq)
    if chunk.finish_reason is None or chunk.usage is None:
        raise RuntimeError("generation: the final chunk carries no finish reason")
    end = seq.finished_at or time.monotonic()
    ttft = (seq.first_token_at - seq.arrival) * 1000 if seq.first_token_at is not None else 0.0
    return GenerationResult(text="".join(texts), finish_reason=chunk.finish_reason, usage=chunk.usage,
                            tokens=tokens, time_to_first_token_ms=ttft, total_time_ms=(end - seq.arrival) * 1000,
                            prompt_tokens=prompt_tokens)


async def collect_all(seqs: list[Sequence], abandon: Abandon) -> list[GenerationResult]:
    """Every sequence of one request, collected (GenerationEngine.generate_many): when one fails, or the caller
    goes away, every other one is cancelled."""
    for seq in seqs:
        seq.whole = True
    if len(seqs) == 1:
        return [await collect(seqs[0], abandon)]
    tasks = [asyncio.ensure_future(collect(seq, abandon)) for seq in seqs]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()     # each one's collect abandons its sequence
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class SequenceStream:
    """The chunks of one admitted sequence (`stream_many`): an async iterator whose aclose() cancels the
    sequence, whether or not it was ever iterated (an async generator's cleanup would not run then).

    `next_chunk` is the sequence's own: the request's stream (server/leases.py), which keeps the end and
    the errors itself, reads the engine's queue through it with no frame of this one between."""

    __slots__ = ("_seq", "_abandon", "_ended", "next_chunk")

    def __init__(self, seq: Sequence, abandon: Abandon) -> None:
        self._seq, self._abandon, self._ended = seq, abandon, False
        self.next_chunk: Callable[[], Awaitable[StreamChunk]] = seq.next_chunk

    def __aiter__(self) -> "SequenceStream":
        return self

    async def __anext__(self) -> StreamChunk:
        if self._ended:
            raise StopAsyncIteration
        try:
            chunk = await self._seq.next_chunk()
        except BaseException:
            await self.aclose()
            raise
        if chunk.final:
            self._ended = True
        return chunk

    async def aclose(self) -> None:
        self._ended = True
        if not self._seq.done:
            self._abandon(self._seq)

    def __del__(self) -> None:
        # Dropped unclosed (a response never sent: its client left before the first byte): nobody can read it.
        if not self._ended and not self._seq.done:
            try:
                self._abandon(self._seq)
            except Exception:   # (at interpreter exit the engine may be half torn down: nothing left to free)
                pass


def refuse_streamed_beams(jobs: list[Job]) -> None:
    for _, params in jobs:
        if params.num_beams > 1:
            raise ValueError(f"parameters.num_beams: a beam search's hypotheses are only known at its end, so it is "
                             f"not streamed; use num_beams 1 to stream, or a non-streaming call, "
                             f"got {params.num_beams}")
