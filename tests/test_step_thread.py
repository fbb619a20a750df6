"""The engine's step thread: the event loop goes on only once the worker is about to run its graph (the GIL is
then free), or when the step ends without one."""
from __future__ import annotations

import asyncio
import threading
import time

from server.generation.step_thread import StepThread, entering_graph


def _order(step) -> tuple[list[str], str]:
    """What happened before the loop ran its next callback after submitting `step`, and the step's result."""
    events: list[str] = []

    async def body() -> str:
        thread = StepThread("test-step", handoff_timeout_s=10.0)   # generous: a loaded machine must not decide
        try:
            asyncio.get_running_loop().call_soon(events.append, "loop")
            return await thread.run(step, events)
        finally:
            thread.shutdown()

    return events, asyncio.run(asyncio.wait_for(body(), 30))


def test_the_loop_goes_on_once_the_worker_enters_its_graph() -> None:
    release = threading.Event()

    def step(events: list[str]) -> str:
        time.sleep(0.02)                 # the feeds: the loop must not take the GIL back meanwhile
        events.append("feeds")
        entering_graph()
        release.wait(5)                  # the graph run: the loop is free during it
        return "done"

    threading.Timer(0.2, release.set).start()
    events, result = _order(step)
    assert events[:2] == ["feeds", "loop"] and result == "done"


def test_a_step_without_a_graph_lets_the_loop_go_on_at_its_end() -> None:
    def step(events: list[str]) -> str:
        time.sleep(0.02)
        events.append("step")
        return "no graph"

    events, result = _order(step)
    assert events == ["step", "loop"] and result == "no graph"


def test_entering_a_graph_outside_a_step_does_nothing() -> None:
    entering_graph()      # warmup runs graphs on the loop's thread, outside any step
