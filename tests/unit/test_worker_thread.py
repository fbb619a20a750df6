"""The engine's worker thread (server/generation/worker_thread.py): calls run in order on its own thread, results and
errors come back as the loop's futures, a call cancelled meanwhile is dropped, and stop ends the thread."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from server.generation.worker_thread import WorkerThread


def test_calls_run_in_order_on_the_thread_and_answer_their_futures():
    async def main():
        worker = WorkerThread("generate-test")
        seen = []

        def work(x):
            seen.append((x, threading.current_thread().name))
            return x * 2
        loop = asyncio.get_running_loop()
        results = await asyncio.gather(*(worker.submit(loop, work, i) for i in range(5)))
        worker.stop()
        return results, seen
    results, seen = asyncio.run(main())
    assert results == [0, 2, 4, 6, 8]
    assert seen == [(i, "generate-test") for i in range(5)]


def test_an_error_in_a_call_is_raised_where_it_is_awaited_and_the_thread_goes_on():
    async def main():
        worker = WorkerThread("generate-test")
        loop = asyncio.get_running_loop()

        def boom(_):
            raise ValueError("step failed")
        with pytest.raises(ValueError, match="step failed"):
            await worker.submit(loop, boom, None)
        after = await worker.submit(loop, lambda x: x + 1, 1)
        worker.stop()
        return after
    assert asyncio.run(main()) == 2


def test_a_cancelled_wait_drops_the_result_and_stop_ends_the_thread():
    release = threading.Event()

    async def main():
        worker = WorkerThread("generate-test")
        loop = asyncio.get_running_loop()
        pending = worker.submit(loop, lambda _: release.wait(5) and "late", None)
        pending.cancel()
        release.set()
        await asyncio.sleep(0.05)          # the thread's answer reaches a cancelled future: nothing raised
        assert pending.cancelled()
        worker.stop()
        return worker
    worker = asyncio.run(main())
    worker._thread.join(5)
    assert not worker._thread.is_alive()


def test_a_result_for_a_closed_loop_is_dropped_without_killing_the_thread():
    worker = WorkerThread("generate-test")
    loop = asyncio.new_event_loop()
    started = threading.Event()
    gate = threading.Event()
    worker.submit(loop, lambda _: (started.set(), gate.wait(5)), None)
    assert started.wait(5)
    loop.close()
    gate.set()

    async def after():
        return await worker.submit(asyncio.get_running_loop(), lambda x: x, "still serving")
    time.sleep(0.05)
    assert asyncio.run(after()) == "still serving"
    worker.stop()
