"""The one stream of a generation request, read by every door: gRPC GenerateStream (server/grpc/task.py) and the
OpenAI SSE writers (server/http/openai/) iterate the same RequestStream, and only convert its parts to their wire.

It reads the engine's queue of one sequence (server/generation/sequence.py) directly and is, alone, what stands
between that queue and a door: it carries the request's share of its version's lease (server/leases.py), the
echoed prompt's text (on the first part), the engine spans when tracing, and maps the engine's errors to the
protocol's (server/generation/errors.py) once. Its end — the final chunk, an error, aclose() by a door whose
client went away or was cancelled — cancels the sequence if it still runs (its slot is freed now, not at garbage
collection) and gives back the lease share, exactly once.
"""
from __future__ import annotations

from typing import Any, AsyncIterator, Awaitable, Callable, Protocol

from server.generation import StreamChunk
from server.generation.errors import serving_error
from server.leases import SharedLease, prompt_text
from server.model import ServedModel
from server.protocol.types import StreamPart
from server.runtime import tracing


class ChunkSource(Protocol):
    """What a served model's stream_many hands out per job: chunks, the last with final=True; aclose() cancels."""

    def __anext__(self) -> Awaitable[StreamChunk]: ...

    async def aclose(self) -> None: ...


class RequestStream:
    """One job's chunks as StreamParts (async iterator); close it (aclose) when not read to its end."""

    __slots__ = ("model", "version", "_served", "_source", "_next", "_echo", "_held", "_spans", "_open")

    def __init__(self, served: ServedModel, source: ChunkSource, echo: str | list[int] | None, held: SharedLease,
                 parent_span: Any = None) -> None:
        self.model, self.version = served.name, served.version
        self._served, self._source, self._echo, self._held = served, source, echo, held
        # An engine stream lends its sequence's own reader (generation/streams.py); any other source is iterated.
        self._next: Callable[[], Awaitable[StreamChunk]] = getattr(source, "next_chunk", None) or source.__anext__
        self._open = True
        self._spans = StreamSpans(parent_span) if parent_span is not None else None

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> StreamPart:
        if not self._open:
            raise StopAsyncIteration
        try:
            chunk = await self._next()
        except StopAsyncIteration:
            self._end(True)
            raise
        except Exception as exc:
            await self.aclose()
            raise serving_error(exc) from None
        except BaseException:      # cancelled (the door's task): the sequence is cancelled with it
            await self.aclose()
            raise
        text = None
        if self._echo is not None:
            text, self._echo = prompt_text(self._served, self._echo), None
        if self._spans is not None:
            self._spans.chunk(chunk)
        if chunk.final:
            self._end(True)
        return StreamPart(model=self.model, version=self.version, chunk=chunk, prompt_text=text)

    async def aclose(self) -> None:
        if self._open:
            try:
                await self._source.aclose()
            finally:
                self._end(False)

    def _end(self, ok: bool) -> None:
        if self._open:
            self._open = False
            if self._spans is not None:
                self._spans.end(ok)
            self._held.end(ok)


class StreamSpans:
    """A stream's engine spans (tracing on): engine.first_token from submission to the first chunk, then
    engine.decode to the last; children of the data plane's span."""

    __slots__ = ("_parent", "_first", "_decode", "_tokens")

    def __init__(self, parent: Any) -> None:
        self._parent = parent
        self._first = tracing.start("engine.first_token", parent)
        self._decode: Any = None
        self._tokens = 0

    def chunk(self, chunk: StreamChunk) -> None:
        self._tokens += len(chunk.tokens)
        if self._first is not None:
            tracing.end(self._first)
            self._first = None
            self._decode = tracing.start("engine.decode", self._parent)

    def end(self, ok: bool) -> None:
        error = None if ok else RuntimeError("stream closed before its end")
        tracing.end(self._first, error)
        tracing.end(self._decode, error, tokens=self._tokens)
        self._first = self._decode = None


__all__ = ["ChunkSource", "RequestStream", "StreamSpans"]
