"""Server-sent events and the streams behind them: a request's streams (the data plane's RequestStreams, which
gRPC reads too) opened together (errors before the 200), merged as their parts come, answered as `data: {...}`
events ending with `data: [DONE]`."""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from server.http.errors import classify_error, openai_body
from server.http.openai.answers import encode
from server.protocol.types import PartStream, StreamPart

DONE = b"data: [DONE]\n\n"
# SSE ends lines at CR and LF only, and JSON escapes those; but common clients (httpx's iter_lines, Python's
# str.splitlines) also end them at NEL, LINE SEPARATOR and PARAGRAPH SEPARATOR, which JSON may carry raw. A
# token's text can hold them, so they go out escaped and every client sees one event per line.
_LINE_BREAKERS = ((b"\xc2\x85", b"\\u0085"), (b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"))


def sse(payload: Any) -> bytes:
    data = encode(payload)
    for raw, escaped in _LINE_BREAKERS:
        if raw in data:
            data = data.replace(raw, escaped)
    return b"data: " + data + b"\n\n"


def event_stream(events: AsyncIterator[bytes], streams: list[PartStream], route: str) -> Response:
    """The 200 answer streaming `events` (built from `streams`, which it closes at the end), then [DONE]."""
    return _EventStream(streams, _ended(events, streams, route), media_type="text/event-stream",
                        headers={"cache-control": "no-cache", "x-accel-buffering": "no"})


class _EventStream(StreamingResponse):
    """A StreamingResponse that closes its streams however it ends. The body's own `finally` does that once the
    body has started; a client gone before the first byte ends the response before its body is ever iterated
    (Starlette stops at the status line), and an async generator that never started runs no `finally`: the
    sequences would go on generating for no one and hold their lease until garbage collection."""

    def __init__(self, streams: list[PartStream], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._streams = streams

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await close(self._streams)


async def _ended(events: AsyncIterator[bytes], streams: list[PartStream], route: str) -> AsyncIterator[bytes]:
    try:
        async for event in events:
            yield event
    except Exception as exc:  # the status line is gone: the error travels as an event (the openai client raises it)
        status, message, _ = classify_error(exc, f"http {route} stream")
        yield sse(openai_body(status, message))
    finally:
        await close(streams)
    yield DONE


async def opened(streams: list[PartStream]) -> list[StreamPart | None]:
    """The first part of each of a request's streams. Admission and parameter errors answer with their status,
    not a 200 stream, so every first part is awaited (one stream's in this task, several in one task each); on an
    error every stream is closed and it is raised."""
    try:
        if len(streams) == 1:
            return [await _first(streams[0])]
        firsts = await asyncio.gather(*(_first(st) for st in streams), return_exceptions=True)
    except BaseException:     # failed, or cancelled (its client left): the streams that had started are closed too
        await close(streams)
        raise
    failed = [f for f in firsts if isinstance(f, BaseException)]
    if failed:
        await close(streams)
        raise failed[0]
    return firsts  # type: ignore[return-value]


async def close(streams: list[PartStream]) -> None:
    for st in streams:
        await st.aclose()


async def _first(stream: PartStream) -> StreamPart | None:
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return None
    except BaseException:
        await stream.aclose()
        raise


async def merged(firsts: list[StreamPart | None], streams: list[PartStream]
                 ) -> AsyncIterator[tuple[int, StreamPart]]:
    """Every part of the opened streams, each with its stream's index: the first parts in order, then the rest as
    they come — one stream's read here straight from the request's stream (no task, no queue), several through a
    queue their readers fill."""
    for i, first in enumerate(firsts):
        if first is not None:
            yield i, first
    live = [i for i, first in enumerate(firsts) if first is not None and not first.chunk.final]
    if len(live) == 1:
        i = live[0]
        async for part in streams[i]:
            yield i, part
    elif live:
        async for item in _merge({i: streams[i] for i in live}):
            yield item


async def _merge(sources: dict[int, PartStream]) -> AsyncIterator[tuple[int, StreamPart]]:
    """The parts of several streams as they come, each with its stream's index."""
    queue: asyncio.Queue[tuple[int, StreamPart | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, source: PartStream) -> None:
        try:
            async for part in source:
                await queue.put((i, part))
            await queue.put((i, None))
        except Exception as exc:
            await queue.put((i, exc))

    tasks = [asyncio.create_task(pump(i, source)) for i, source in sources.items()]
    try:
        running = len(tasks)
        while running:
            i, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
