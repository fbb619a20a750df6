"""Decode steps computed while the event loop applies the last (--overlap-step-ms), through the OpenAI SSE door of a
real server process: streamed completions arriving a few milliseconds apart (greedy, seeded sampling, a stop string,
n = 2, logprobs) answer exactly as a server without the overlap answers them, and the server counts the steps it
overlapped. Both servers run one onnxruntime thread: the overlap needs a core left for the event loop."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import openai
import pytest

from tests.server_process import ServerProcess

GPT = "tiny-gpt"
PROMPTS = ["To be, or not to be", "Romeo", "Now is the winter of our discontent", "a", "What light"]


@pytest.fixture(scope="module")
def servers(tiny_repository: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    common = ["--http-port", "0", "--metrics-port", "0", "--intra-op-threads", "1"]
    with ServerProcess(tiny_repository, common) as on, \
            ServerProcess(tiny_repository, [*common, "--overlap-step-ms", "0"]) as off:
        yield on, off


def _streamed(server: ServerProcess, prompt: str, kwargs: dict[str, Any]) -> list[tuple[str, list[str], Any]]:
    """Each choice's text, its tokens as the door spells them, and its finish reason."""
    oai = openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0, timeout=60)
    parts: dict[int, tuple[list[str], list[str], list[Any]]] = {}
    for event in oai.completions.create(model=GPT, prompt=prompt, stream=True, logprobs=0, **kwargs):
        for choice in event.choices:
            text, tokens, reason = parts.setdefault(choice.index, ([], [], []))
            text.append(choice.text)
            tokens += choice.logprobs.tokens if choice.logprobs else []
            reason.append(choice.finish_reason)
    return [("".join(t), tokens, [r for r in reasons if r]) for _, (t, tokens, reasons) in sorted(parts.items())]


def _arriving(server: ServerProcess, jobs: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """The jobs' streams started 4 ms apart (most arrive while others decode), each read on its own thread."""
    out: list[Any] = [None] * len(jobs)

    def one(i: int) -> None:
        time.sleep(0.004 * i)
        out[i] = _streamed(server, *jobs[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    return out


def test_staggered_sse_completions_answer_alike_with_and_without_the_overlap(
        servers: tuple[ServerProcess, ServerProcess]) -> None:
    on, off = servers
    [(greedy, _, _)] = _streamed(off, PROMPTS[0], dict(max_tokens=16, temperature=0))
    stop = greedy[6:9]                      # a string the greedy answer holds: it ends the stream early
    jobs = [(PROMPTS[0], dict(max_tokens=16, temperature=0, stop=[stop])),
            (PROMPTS[1], dict(max_tokens=12, temperature=0.9, top_p=0.95, seed=3)),
            (PROMPTS[2], dict(max_tokens=9, n=2, temperature=1.1, seed=8)),
            (PROMPTS[3], dict(max_tokens=1, temperature=0)),
            (PROMPTS[4], dict(max_tokens=20, temperature=0, frequency_penalty=0.5))] * 2
    before = on.metric("ortserve_overlapped_steps_total", model=GPT)
    with_overlap, without = _arriving(on, jobs), _arriving(off, jobs)
    assert with_overlap == without
    assert with_overlap[0][0][0] == greedy[:greedy.index(stop)] and with_overlap[0][0][2] == ["stop"]
    assert off.metric("ortserve_overlapped_steps_total", model=GPT) == 0
    if len(os.sched_getaffinity(0)) > 1:     # on one core no step overlaps the loop (server/runtime_config.py)
        assert on.metric("ortserve_overlapped_steps_total", model=GPT) > before
