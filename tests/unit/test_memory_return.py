"""Memory given back after large encoder requests (server/encoders/memory.py): the trims follow the last large
request (coalesced), small requests schedule none, and the request's characters are read from each task's
first argument."""
from __future__ import annotations

import asyncio

import pytest

from server.encoders import memory
from server.protocol.pairs import Pairs


def test_trims_follow_the_last_large_request_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "DELAYS_S", (0.05, 0.2))
    calls: list[int] = []
    returner = memory.MemoryReturner(lambda: calls.append(1) or 1)

    async def run() -> None:
        returner.after_request(memory.LARGE_REQUEST_CHARS - 1)   # small: nothing scheduled
        await asyncio.sleep(0.3)
        assert calls == []
        for _ in range(3):                                       # three large ones in a row: one pair of trims
            returner.after_request(memory.LARGE_REQUEST_CHARS)
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.4)

    asyncio.run(run())
    assert len(calls) == 2 and returner.trims == 2


def test_without_malloc_trim_nothing_is_scheduled() -> None:
    async def run() -> None:
        memory.MemoryReturner(None).after_request(10 * memory.LARGE_REQUEST_CHARS)   # must not raise

    asyncio.run(run())


def test_request_characters_are_counted_from_each_task_shape() -> None:
    assert memory.text_chars(["abc", "de"]) == 5
    assert memory.text_chars([("abc", None), ("de", "fgh")]) == 8
    assert memory.text_chars(Pairs.broadcast("query", "q", "documents", ["abcd", "ef"])) == 7
    assert memory.text_chars(object()) == 0
