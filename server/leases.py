"""A request's hold on one model version (Lease), shared by the streams of one request (SharedLease), and those
streams: RequestStream, the one stream of a generation request, which every door reads.

A lease is taken by DataPlane.lease() after admission (server/dataplane.py): while held, the version counts the
request in flight and cannot close its served model; when it ends, the request is recorded in the version's
statistics (success or failure, with its duration) and the plane's in-flight count goes down.

A RequestStream is what stands between the engine's queue of one sequence (server/generation/sequence.py) and a
door: gRPC GenerateStream (server/grpc/task.py) and the OpenAI SSE writers (server/http/openai/) iterate it and
only convert its parts to their wire. It reads that queue directly, carries the request's share of the lease, the
echoed prompt's text (on the first part) and the engine spans when tracing, and maps the engine's errors to the
protocol's (server/generation/errors.py) once. Its end — the final chunk, an error, aclose() by a door whose
client went away or was cancelled — cancels the sequence if it still runs (its slot is freed now, not at garbage
collection) and gives back the lease share, exactly once.
"""
from __future__ import annotations

import time
from typing import Any, Awaitable, Callable, Protocol

from server.generation import StreamChunk
from server.generation.errors import serving_error
from server.model import ServedModel
from server.protocol.errors import ServingError
from server.protocol.types import StreamPart
from server.repository.version import ModelVersion
from server.runtime import tracing


def prompt_text(served: ServedModel, prompt: str | list[int]) -> str:
    """A prompt as text: token ids decoded by the version that generates from them (checked by then)."""
    return prompt if isinstance(prompt, str) else served.prompt_text(prompt)


def check_echo(served: ServedModel, echo: bool) -> None:
    """An encoder-decoder's prompt is its source: not the start of the text it writes, and not scored by its decoder,
    so an echo (the prompt before the answer, its tokens scored with logprobs) has nothing to mean there. Refused by
    name before compute, on every door (docs/protocol.md)."""
    if echo and served.manifest.encoder_decoder is not None:
        raise ServingError.invalid("echo", f"{served.name!r} is an encoder-decoder: its prompt is the source, not the "
                                           f"start of its output (echo is for decoder models)")


class Lease:
    """A request's hold on one model version (a plain class rather than a generator-based context manager: this
    runs on every request). `done` is called with the version when the lease ends."""

    __slots__ = ("_done", "_version", "_started", "span", "_token")

    def __init__(self, done: Callable[[ModelVersion], None], version: ModelVersion, operation: str = "") -> None:
        self._done = done
        self._version = version
        self._started = time.perf_counter()
        # dataplane.<operation>, a child of the door's span (None unless tracing)
        self.span = tracing.start(f"dataplane.{operation}", model=version.name, version=version.version) \
            if operation and tracing.enabled() else None
        self._token = None

    def __enter__(self) -> ServedModel:
        self._token = tracing.use(self.span)
        try:
            return self._version.model
        except BaseException as exc:  # no served model after all: the lease ends here, counted as a failure
            self.__exit__(type(exc), exc, None)
            raise

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self._version.stats.record_request(kind is None, time.perf_counter() - self._started)
        self._done(self._version)
        if self.span is not None:
            tracing.reset(self._token)
            tracing.end(self.span, exc if exc is not None else
                        (RuntimeError(kind.__name__) if kind is not None else None))


class SharedLease:
    """One lease held by a request's streams: ended (and recorded) when the last one ends."""

    __slots__ = ("_lease", "_open", "_failed")

    def __init__(self, lease: Lease, streams: int) -> None:
        self._lease, self._open, self._failed = lease, streams, False
        if streams == 0:
            lease.__exit__(None, None, None)

    def end(self, ok: bool) -> None:
        self._failed = self._failed or not ok
        self._open -= 1
        if self._open == 0:
            self._lease.__exit__(Exception if self._failed else None, None, None)   # (the statistics' outcome)


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


__all__ = ["ChunkSource", "Lease", "RequestStream", "SharedLease", "StreamSpans", "check_echo", "prompt_text"]
