"""--stream-interval n: a real server sends the first token alone, then the tokens of n steps per message (gRPC
GenerateStream and the OpenAI stream), and what a client reassembles equals the unary answer."""
from __future__ import annotations

import json
from itertools import accumulate
from pathlib import Path

import grpc
import httpx2 as httpx
import pytest

from clients import OrtserveClient, OrtserveError
from tests.server_process import ServerProcess

GPT = "tiny-gpt"
PROMPT = "To be, or not to be"


@pytest.fixture(scope="module")
def server(tiny_repository: Path) -> ServerProcess:
    with ServerProcess(tiny_repository, ["--stream-interval", "4", "--http-port", "0"]) as proc:
        yield proc


def test_grpc_stream_sends_the_first_token_then_four_per_message(server: ServerProcess) -> None:
    with OrtserveClient(server.address, timeout=60) as client:
        full = client.generate(PROMPT, GPT, max_new_tokens=10, ignore_eos=True, top_logprobs=2)
        chunks = list(client.generate_stream(PROMPT, GPT, max_new_tokens=10, ignore_eos=True, top_logprobs=2))
    # Messages end after tokens 1, 5, 9 and 10 (a consumer that fell behind may merge neighbours: fewer ends).
    assert set(accumulate(len(c.tokens) for c in chunks)) <= {1, 5, 9, 10} and len(chunks[-1].tokens) >= 1
    assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert "".join(c.text for c in chunks) == full.text
    streamed = [t for c in chunks for t in c.tokens]
    assert [t.token_id for t in streamed] == [t.token_id for t in full.tokens]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in full.tokens], abs=1e-5)
    assert all(len(t.top_logprobs) == 2 for t in streamed)
    assert chunks[-1].finish_reason == "length" and chunks[-1].usage == full.usage


def test_openai_stream_carries_the_same_text_and_logprobs_in_fewer_events(server: ServerProcess) -> None:
    body = {"model": GPT, "prompt": PROMPT, "max_tokens": 9, "temperature": 0, "ignore_eos": True, "logprobs": 1}
    url = f"{server.http_url}/v1/completions"
    whole = httpx.post(url, json=body, timeout=60).json()["choices"][0]
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as response:
        assert response.status_code == 200
        events = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    choices = [e["choices"][0] for e in events if e["choices"]]
    assert set(accumulate(len(c["logprobs"]["tokens"]) for c in choices)) <= {1, 5, 9}
    assert "".join(c["text"] for c in choices) == whole["text"]
    assert [t for c in choices for t in c["logprobs"]["tokens"]] == whole["logprobs"]["tokens"]
    assert choices[-1]["finish_reason"] == "length"


def test_a_call_asks_for_fewer_messages_never_for_more(server: ServerProcess) -> None:
    """GenerateStream's stream_interval (vLLM's per-request spelling): 8 raises the server's 4; 2 does not lower
    it; max_new_tokens sends the first token alone and the rest with the end."""
    with OrtserveClient(server.address, timeout=60) as client:
        full = client.generate(PROMPT, GPT, max_new_tokens=10, ignore_eos=True)
        ends = {}
        for interval in (8, 2, 10):
            chunks = list(client.generate_stream(PROMPT, GPT, max_new_tokens=10, ignore_eos=True,
                                                 stream_interval=interval))
            assert "".join(c.text for c in chunks) == full.text
            assert [t.token_id for c in chunks for t in c.tokens] == [t.token_id for t in full.tokens]
            ends[interval] = set(accumulate(len(c.tokens) for c in chunks))
    # (a consumer that fell behind may merge neighbouring messages: fewer ends, never others)
    assert ends[8] <= {1, 9, 10} and ends[2] <= {1, 5, 9, 10} and ends[10] <= {1, 10}


def test_a_bad_stream_interval_is_refused_by_name_on_both_doors(server: ServerProcess) -> None:
    with OrtserveClient(server.address, timeout=60) as client:
        with pytest.raises(OrtserveError) as err:
            list(client.generate_stream(PROMPT, GPT, max_new_tokens=4, stream_interval=0))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "parameters.stream_interval" in err.value.message
    body = {"model": GPT, "prompt": PROMPT, "max_tokens": 4, "stream": True, "stream_interval": 0}
    response = httpx.post(f"{server.http_url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 400 and "stream_interval" in response.json()["error"]["message"]


def test_openai_stream_interval_sends_the_first_token_then_the_rest(server: ServerProcess) -> None:
    body = {"model": GPT, "prompt": PROMPT, "max_tokens": 9, "temperature": 0, "ignore_eos": True, "logprobs": 1}
    url = f"{server.http_url}/v1/completions"
    whole = httpx.post(url, json=body, timeout=60).json()["choices"][0]
    with httpx.stream("POST", url, json={**body, "stream": True, "stream_interval": 9}, timeout=60) as response:
        assert response.status_code == 200
        events = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    choices = [e["choices"][0] for e in events if e["choices"]]
    assert [len(c["logprobs"]["tokens"]) for c in choices] in ([1, 8], [9])
    assert "".join(c["text"] for c in choices) == whole["text"]
