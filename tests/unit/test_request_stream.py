"""The one stream of a generation request (server/leases.py RequestStream), in process: an engine failure reaches a
door as the protocol's error kind, the source is closed and the lease share given back once, whether the stream
ends, fails or is closed; and an engine stream is read through its sequence's own next_chunk.

The sources are stand-ins that record what is asked of them (the real engine's streams go through the same class
in tests/e2e/http/test_stream_doors.py and the doors' streaming tests)."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from server.generation import EngineStoppedError, OverloadedError, StreamChunk
from server.leases import RequestStream, SharedLease
from server.protocol.errors import Code, ServingError


class Source:
    """Chunks, then optionally an exception, from `next_chunk` (as an engine SequenceStream lends it)."""

    def __init__(self, chunks: list[StreamChunk], error: BaseException | None = None) -> None:
        self.chunks, self.error, self.closed, self.reads = list(chunks), error, 0, 0

    async def next_chunk(self) -> StreamChunk:
        self.reads += 1
        if self.chunks:
            return self.chunks.pop(0)
        if self.error is not None:
            raise self.error
        await asyncio.sleep(3600)     # a sequence still generating
        raise AssertionError("unreachable")

    async def __anext__(self) -> StreamChunk:
        raise AssertionError("an engine stream is read through next_chunk")

    async def aclose(self) -> None:
        self.closed += 1


class Outcome:
    """The lease a SharedLease ends: how often, and with what outcome."""

    span = None

    def __init__(self) -> None:
        self.ends: list[Any] = []

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        self.ends.append(kind)


class Served:
    name, version = "m", 3

    def prompt_text(self, ids: list[int]) -> str:
        return "ids " + " ".join(map(str, ids))


def _stream(source: Source, echo: Any = None) -> tuple[RequestStream, Outcome]:
    lease = Outcome()
    return RequestStream(Served(), source, echo, SharedLease(lease, 1)), lease  # type: ignore[arg-type]


def _final(text: str) -> StreamChunk:
    return StreamChunk(text=text, final=True, finish_reason="length")


def test_parts_carry_the_version_and_the_echo_once_and_the_end_gives_the_lease_back() -> None:
    source = Source([StreamChunk(text="a"), _final("b")])
    stream, lease = _stream(source, echo=[5, 6])

    async def read() -> list[Any]:
        return [(p.model, p.version, p.chunk.text, p.prompt_text) async for p in stream]

    assert asyncio.run(read()) == [("m", 3, "a", "ids 5 6"), ("m", 3, "b", None)]
    assert lease.ends == [None] and source.reads == 2     # ended on the final chunk: not read again
    asyncio.run(stream.aclose())
    assert lease.ends == [None] and source.closed == 0    # a finished stream closes nothing more


@pytest.mark.parametrize(("error", "code"), [(RuntimeError("decode step failed: x"), Code.INTERNAL),
                                             (EngineStoppedError("stopped"), Code.UNAVAILABLE),
                                             (OverloadedError("full"), Code.RESOURCE_EXHAUSTED),
                                             (TimeoutError(), Code.DEADLINE_EXCEEDED),
                                             (ValueError("parameters.stop: bad"), Code.INVALID_ARGUMENT)])
def test_an_engine_failure_mid_stream_is_the_protocols_error_and_ends_the_stream_once(error: BaseException,
                                                                                      code: Code) -> None:
    source = Source([StreamChunk(text="a")], error)
    stream, lease = _stream(source)

    async def read() -> list[str]:
        texts = []
        with pytest.raises(ServingError) as raised:
            async for part in stream:
                texts.append(part.chunk.text)
        assert raised.value.code == code
        return texts

    assert asyncio.run(read()) == ["a"]
    assert source.closed == 1 and lease.ends == [Exception]
    asyncio.run(stream.aclose())
    assert source.closed == 1 and lease.ends == [Exception]


def test_a_cancelled_reader_closes_the_source_and_gives_the_lease_back_as_a_failure() -> None:
    source = Source([StreamChunk(text="a")])
    stream, lease = _stream(source)

    async def read() -> None:
        assert (await stream.__anext__()).chunk.text == "a"
        task = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(read())
    assert source.closed == 1 and lease.ends == [Exception]


def test_a_stream_closed_unread_closes_its_source() -> None:
    source = Source([_final("never read")])
    stream, lease = _stream(source)
    asyncio.run(stream.aclose())
    assert source.closed == 1 and source.reads == 0 and lease.ends == [Exception]


@pytest.mark.parametrize("spec_version", ["2.4", "2.3"])
def test_an_sse_answer_whose_client_left_before_the_first_byte_closes_its_stream(spec_version: str) -> None:
    """The client is gone when the status line would go out: under ASGI 2.4 the server's send raises OSError;
    before 2.4, Starlette's disconnect listener hears it first and cancels the body. Either way the body was never
    iterated, and the stream must still be closed and its lease share given back."""
    from starlette.requests import ClientDisconnect

    from server.http.openai.stream import event_stream

    source = Source([StreamChunk(text="a")])
    stream, lease = _stream(source)

    async def events() -> Any:
        async for part in stream:
            yield part.chunk.text.encode()

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if spec_version >= "2.4":
            raise OSError("connection reset by peer")
        await asyncio.sleep(3600)           # a peer that no longer reads: the listener ends the response

    async def answer() -> None:
        response = event_stream(events(), [stream], "Completions")
        scope = {"type": "http", "asgi": {"spec_version": spec_version}}
        try:
            await response(scope, receive, send)
        except ClientDisconnect:
            pass

    asyncio.run(answer())
    assert source.closed == 1 and source.reads == 0
    assert lease.ends == [Exception]        # given back once, counted as not answered in full
