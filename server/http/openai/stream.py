"""Server-sent events and the streams behind them: a request's streams opened together (errors before the 200),
merged as their parts come, answered as `data: {...}` events ending with `data: [DONE]`."""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from starlette.responses import Response, StreamingResponse

from server.http.errors import classify_error, openai_body
from server.http.openai.answers import encode
from server.protocol.types import StreamPart

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


def event_stream(events: AsyncIterator[bytes], streams: list[AsyncIterator[StreamPart]], route: str) -> Response:
    """The 200 answer streaming `events` (built from `streams`, which it closes at the end), then [DONE]."""
    return StreamingResponse(_ended(events, streams, route), media_type="text/event-stream",
                             headers={"cache-control": "no-cache", "x-accel-buffering": "no"})


async def _ended(events: AsyncIterator[bytes], streams: list[AsyncIterator[StreamPart]], route: str
                 ) -> AsyncIterator[bytes]:
    try:
        async for event in events:
            yield event
    except Exception as exc:  # the status line is gone: the error travels as an event (the openai client raises it)
        status, message, _ = classify_error(exc, f"http {route} stream")
        yield sse(openai_body(status, message))
    finally:
        await close(streams)
    yield DONE


async def opened(streams: list[AsyncIterator[StreamPart]]) -> list[StreamPart | None]:
    """The first part of each of a request's streams. Admission and parameter errors answer with their status,
    not a 200 stream, so every first part is awaited; on an error every stream is closed and it is raised."""
    try:
        firsts = await asyncio.gather(*(_first(st) for st in streams), return_exceptions=True)
    except BaseException:     # cancelled (its client left): the streams that had started are closed too
        await close(streams)
        raise
    failed = [f for f in firsts if isinstance(f, BaseException)]
    if failed:
        await close(streams)
        raise failed[0]
    return firsts  # type: ignore[return-value]


async def close(streams: list[AsyncIterator[StreamPart]]) -> None:
    for st in streams:
        await st.aclose()  # type: ignore[attr-defined]


async def _first(stream: AsyncIterator[StreamPart]) -> StreamPart | None:
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return None
    except BaseException:
        await stream.aclose()  # type: ignore[attr-defined]
        raise


async def _parts(first: StreamPart | None, stream: AsyncIterator[StreamPart]) -> AsyncIterator[StreamPart]:
    if first is None:
        return
    yield first
    async for part in stream:
        yield part


def merged(firsts: list[StreamPart | None], streams: list[AsyncIterator[StreamPart]]
           ) -> AsyncIterator[tuple[int, StreamPart]]:
    """Every part of the opened streams (their first parts first) with its stream's index, as they come."""
    return _merge([_parts(f, st) for f, st in zip(firsts, streams)])


async def _merge(sources: list[AsyncIterator[StreamPart]]) -> AsyncIterator[tuple[int, StreamPart]]:
    """The parts of several streams as they come, each with its stream's index (one stream: no task, no queue)."""
    if len(sources) == 1:
        async for part in sources[0]:
            yield 0, part
        return
    queue: asyncio.Queue[tuple[int, StreamPart | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, source: AsyncIterator[StreamPart]) -> None:
        try:
            async for part in source:
                await queue.put((i, part))
            await queue.put((i, None))
        except Exception as exc:
            await queue.put((i, exc))

    tasks = [asyncio.create_task(pump(i, source)) for i, source in enumerate(sources)]
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
