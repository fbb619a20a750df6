"""One request's rows through a batcher in pieces, a few at a time, all or nothing.

A request of more rows than a batch is cut into pieces of at most `size` rows. At most `window` of its pieces
wait in the batcher queue at once: the next piece is queued when one is answered, so other callers' requests,
queued meanwhile, are computed between this request's pieces (fairness: a big request shares the batcher
instead of holding it for its whole length). When any piece fails, or the caller goes away (its task is
cancelled), every piece still queued is cancelled, which takes it out of the queue: nothing more is computed
for that request.
"""
from __future__ import annotations

import asyncio
from typing import Callable

import numpy as np

Feeds = dict[str, np.ndarray]
Enqueue = Callable[[Feeds, "float | None"], "asyncio.Future[Feeds]"]


async def run_in_pieces(enqueue: Enqueue, feeds: Feeds, size: int, window: int,
                        deadline: float | None) -> list[Feeds]:
    """The outputs of every piece, in order; the first failure is raised after the other pieces are cancelled."""
    rows = next(iter(feeds.values())).shape[0]
    starts = list(range(0, rows, size))
    results: list[Feeds | None] = [None] * len(starts)
    queued: dict[asyncio.Future[Feeds], int] = {}
    following = iter(range(len(starts)))

    def queue_next() -> None:
        index = next(following, None)
        if index is not None:
            start = starts[index]
            queued[enqueue({k: v[start:start + size] for k, v in feeds.items()}, deadline)] = index

    try:
        for _ in range(max(1, window)):
            queue_next()
        while queued:
            done, _ = await asyncio.wait(list(queued), return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                index = queued.pop(future)
                results[index] = future.result()  # a failed piece raises: the finally cancels the rest
                queue_next()
    finally:
        for future in queued:
            future.cancel()
    return [r for r in results if r is not None]


__all__ = ["run_in_pieces"]
