"""The event loop the server runs on: uvloop (libuv, its loop machinery in C) when installed, else asyncio's.

Every request and every streamed token passes through the loop several times (gRPC's completion callbacks,
the batcher's hand-offs, the engine's step results), so the loop's own cost per turn is serving overhead;
uvloop raised the KServe ModelInfer rate (bench/FINDINGS.md, "The server on uvloop"). grpc.aio and uvicorn
both run on it.
"""
from __future__ import annotations

import asyncio
import gc
import importlib.util
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)

EVENT_LOOPS = ("auto", "uvloop", "asyncio")
# The cyclic collector runs its young generation after 700 net allocations of container objects by default, and a
# server allocates a few dozen per request and per token: collections were a visible share of the event loop's
# time, and higher thresholds served more requests a second (bench/FINDINGS.md, "The served g2p request's event
# loop"). Every cycle is still collected, a little later.
GC_THRESHOLDS = (10_000, 10, 10)


def resolve(choice: str) -> str:
    """"auto" -> "uvloop" when it is importable, else "asyncio"; "uvloop" must be importable."""
    if choice not in EVENT_LOOPS:
        raise ValueError(f"--event-loop: must be one of {', '.join(EVENT_LOOPS)}, got {choice!r}")
    installed = importlib.util.find_spec("uvloop") is not None
    if choice == "uvloop" and not installed:
        raise ValueError("--event-loop: uvloop is not installed (pip install uvloop, or --event-loop asyncio)")
    if choice == "auto":
        return "uvloop" if installed else "asyncio"
    return choice


def tune_collector() -> None:
    """The cyclic collector's thresholds of a process that runs engines (GC_THRESHOLDS): the server's, and the batch
    script's processes with the data plane in-process (clients/batch/local.py)."""
    gc.set_threshold(*GC_THRESHOLDS)


def run(main: Coroutine[Any, Any, None], choice: str) -> None:
    """Runs `main` to completion on the chosen loop (resolve() first, so a bad choice fails before this)."""
    loop = resolve(choice)
    tune_collector()
    log.info("event loop: %s; collector thresholds %s", loop, GC_THRESHOLDS)
    if loop == "uvloop":
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)
