"""Property-based fuzzing (hypothesis) of the HTTP front door's JSON bodies against a real server process.

Every generated body gets a documented answer: 200, or a 4xx / 503 / 504 in the route family's error shape
(never 500, never a hang), and afterwards the process is alive and answers a normal request. Besides values
near valid ones, the strategies draw the outside probe's shapes (docs/RELIABILITY.md): integer literals beyond
Python's 4300-digit limit, lone UTF-16 surrogates, many tiny elements, KServe binary bodies with millions of
empty BYTES elements and lying Inference-Header-Content-Length headers; and the fourth probe's (issue 40): beam
searches with extreme length_penalty and early_stopping, echo / prompt_logprobs on an encoder-decoder (a small
Marian, tests/reliability/conftest.py). Cases per route:
ORTSERVE_FUZZ_EXAMPLES (default 60), as tests/reliability/test_fuzz_rpc.py.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any, Iterator

import httpx2 as httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.pair_models import add_tiny_embed
from tests.reliability.conftest import SEQ2SEQ
from tests.server_process import ServerProcess, repository_with

CLASSIFIER, FILL_MASK, GPT, EMBED = "tiny-classifier", "tiny-fill-mask", "tiny-gpt", "tiny-embed"
EXAMPLES = int(os.environ.get("ORTSERVE_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, print_blob=True,
                derandomize=EXAMPLES <= 100,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DOCUMENTED = {200, 400, 404, 413, 415, 429, 503, 504}



class Raw:
    """JSON text the json module will not write: an integer literal beyond Python's 4300-digit limit, a string
    holding a lone UTF-16 surrogate escape, or many tiny elements (the outside probe's shapes)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Raw({self.text[:30]!r}... {len(self.text)} chars)"


def dumps(value: Any) -> str:
    """json.dumps, writing Raw values as they are."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return json.dumps(value)


hostile = (st.integers(4301, 6000).map(lambda n: Raw("-" * (n % 2) + "7" * n))
           | st.sampled_from(["\\ud800", "a\\udfff", "\\udbff\\udbff", "\\ud83d\\ude00"]).map(lambda e: Raw(f'"{e}"'))
           | st.tuples(st.sampled_from(["[]", '""', "0", "{}"]), st.integers(1_000, 150_000)).map(
               lambda t: Raw("[" + ",".join([t[0]] * t[1]) + "]")))
scalars = (st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.integers(-3, 40)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12) | hostile)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=10)


@pytest.fixture(scope="module")
def server(tiny_repository: Path, tiny_checkpoints, seq2seq_model: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = repository_with(tiny_repository, tmp_path_factory.mktemp("fuzz-http") / "repo", CLASSIFIER, FILL_MASK,
                           GPT)
    add_tiny_embed(tiny_checkpoints, repo)
    shutil.copytree(seq2seq_model, repo / SEQ2SEQ)
    proc = ServerProcess(repo, ["--http-port", "0", "--max-message-bytes", str(2 ** 20)])
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60) as c:
        yield c


def _check(response: httpx.Response, openai_shape: bool) -> None:
    assert response.status_code in DOCUMENTED, (response.status_code, response.text[:500])
    if response.status_code == 200:
        return
    error = response.json()["error"]
    if openai_shape:
        assert isinstance(error["message"], str) and error["type"] and error["code"] == response.status_code
    else:
        assert isinstance(error, str) and error


def _alive(server: ServerProcess, client: httpx.Client) -> None:
    assert server.proc.poll() is None, server.output(50)
    assert client.get(f"{server.http_url}/v2/health/ready").status_code == 200
    body = {"model": GPT, "prompt": "a", "max_tokens": 2}
    assert client.post(f"{server.http_url}/v1/completions", json=body).status_code == 200


# The probe's length penalties (a power that overflowed: 500s), then anything.
LENGTH_PENALTIES = [1000, 1100, 1e10, 1e300, 3.4e38, -1e300, -1000, 0, 1, 2]
completion_bodies = st.fixed_dictionaries(
    {"model": st.sampled_from([GPT, SEQ2SEQ, SEQ2SEQ, CLASSIFIER, "nope", "../x"]) | scalars},
    optional={"prompt": st.text(max_size=40) | st.lists(st.text(max_size=10), max_size=3) | values
                        | st.lists(st.integers(-3, 10 ** 6), max_size=8)
                        | st.lists(st.lists(st.integers(-3, 10 ** 6), max_size=4), max_size=3),
              "max_tokens": st.integers(-2, 24) | values, "temperature": st.floats(-1, 3) | values,
              "top_p": st.floats(-0.5, 1.5) | values, "top_k": values, "stop": values, "seed": values,
              "logprobs": st.integers(-1, 7) | values, "echo": st.booleans() | values, "n": values, "stream": st.booleans(),
              "prompt_logprobs": st.integers(-1, 22) | values,
              "stream_options": values, "presence_penalty": values, "frequency_penalty": values,
              "logit_bias": values | st.dictionaries(st.text(max_size=6), values, max_size=3), "ignore_eos": st.booleans(),
              "messages": values, "num_beams": st.integers(1, 4) | values,
              "length_penalty": st.sampled_from(LENGTH_PENALTIES) | st.floats(allow_nan=False) | values,
              "early_stopping": st.sampled_from([True, False, "never"]) | values})


@FUZZ
@given(body=completion_bodies, chat=st.booleans())
def test_fuzzed_completion_bodies(server: ServerProcess, client: httpx.Client, body: dict[str, Any],
                                  chat: bool) -> None:
    url = f"{server.http_url}/v1/{'chat/completions' if chat else 'completions'}"
    response = client.post(url, content=dumps(body).encode(), headers={"content-type": "application/json"})
    _check(response, openai_shape=True)
    if response.status_code == 200 and body.get("stream"):
        assert response.text.rstrip().endswith("data: [DONE]")
    if body.get("model") == SEQ2SEQ and body.get("echo") is True and not chat:
        assert response.status_code != 200, "echo on an encoder-decoder is refused by name (docs/protocol.md)"


tensors = st.fixed_dictionaries(
    {"name": st.sampled_from(["input_ids", "attention_mask", "token_type_ids", "text", "prompt"]) | values,
     "datatype": st.sampled_from(["INT64", "BYTES", "FP32", "BOOL", "INT32"]) | values,
     "shape": st.lists(st.integers(-1, 4), max_size=3) | values},
    optional={"data": st.lists(st.integers(0, 500), max_size=12) | st.lists(st.text(max_size=8), max_size=4) | values,
              "parameters": values})
infer_bodies = st.fixed_dictionaries({"inputs": st.lists(tensors, max_size=3) | values},
                                     optional={"outputs": values, "parameters": values, "id": values})


@FUZZ
@given(body=infer_bodies, model=st.sampled_from([CLASSIFIER, FILL_MASK, GPT, "nope"]))
def test_fuzzed_infer_bodies(server: ServerProcess, client: httpx.Client, body: dict[str, Any], model: str) -> None:
    response = client.post(f"{server.http_url}/v2/models/{model}/infer", content=dumps(body).encode())
    _check(response, openai_shape=False)


tokenizer_bodies = st.fixed_dictionaries(
    {"model": st.sampled_from([GPT, CLASSIFIER, EMBED, FILL_MASK, "nope"]) | scalars},
    optional={"prompt": st.text(max_size=40) | values,
              "tokens": st.lists(st.integers(-3, 10 ** 6), max_size=6) | values,
              "return_token_strs": st.booleans() | values, "add_special_tokens": st.booleans() | values})


@FUZZ
@given(body=tokenizer_bodies, path=st.sampled_from(["/tokenize", "/detokenize"]))
def test_fuzzed_tokenizer_bodies(server: ServerProcess, client: httpx.Client, body: dict[str, Any], path: str) -> None:
    response = client.post(f"{server.http_url}{path}", content=dumps(body).encode(),
                           headers={"content-type": "application/json"})
    _check(response, openai_shape=True)


texts_or_not = st.lists(st.text(max_size=30) | st.fixed_dictionaries({"text": st.text(max_size=20)}) | values,
                        max_size=5) | values
scoring_models = st.sampled_from([EMBED, EMBED, CLASSIFIER, GPT, "nope"]) | scalars
rerank_bodies = st.fixed_dictionaries(
    {"model": scoring_models},
    optional={"query": st.text(max_size=30) | values, "documents": texts_or_not,
              "top_n": st.integers(-1, 6) | values, "return_documents": st.booleans() | values,
              "truncate": st.booleans() | values, "rank_fields": values, "max_tokens_per_doc": values})
score_bodies = st.fixed_dictionaries(
    {"model": scoring_models},
    optional={"text_1": st.text(max_size=30) | texts_or_not, "text_2": st.text(max_size=30) | texts_or_not,
              "truncate": st.booleans() | values, "truncate_prompt_tokens": values})
tei_bodies = st.fixed_dictionaries(
    {"model": scoring_models},
    optional={"query": st.text(max_size=30) | values, "texts": texts_or_not, "raw_scores": st.booleans() | values,
              "return_text": st.booleans() | values, "truncate": st.booleans() | values,
              "truncation_direction": st.sampled_from(["Right", "Left"]) | values})
embedding_bodies = st.fixed_dictionaries(
    {"model": st.sampled_from([EMBED, EMBED, CLASSIFIER]) | scalars},
    optional={"input": st.text(max_size=30) | texts_or_not, "dimensions": st.integers(-2, 70) | values,
              "encoding_format": st.sampled_from(["float", "base64"]) | values,
              "prompt_name": st.text(max_size=8) | values})
tei_embed_bodies = st.fixed_dictionaries(     # TEI's POST /embed (server/http/tei_embed.py)
    {"model": scoring_models},
    optional={"inputs": st.text(max_size=30) | texts_or_not, "normalize": st.booleans() | values,
              "truncate": st.booleans() | values, "prompt_name": st.text(max_size=8) | values,
              "dimensions": st.integers(-2, 70) | values,
              "truncation_direction": st.sampled_from(["Right", "Left"]) | values})


@FUZZ
@given(body=st.one_of(rerank_bodies.map(lambda b: ("/v1/rerank", b)), score_bodies.map(lambda b: ("/v1/score", b)),
                      tei_bodies.map(lambda b: ("/rerank", b)), embedding_bodies.map(lambda b: ("/v1/embeddings", b)),
                      tei_embed_bodies.map(lambda b: ("/embed", b))))
def test_fuzzed_rerank_score_and_embedding_bodies(server: ServerProcess, client: httpx.Client,
                                                  body: tuple[str, dict[str, Any]]) -> None:
    path, payload = body
    response = client.post(f"{server.http_url}{path}", content=dumps(payload).encode(),
                           headers={"content-type": "application/json"})
    _check(response, openai_shape=path.startswith("/v1/"))
    if response.status_code == 200 and path == "/v1/rerank":
        scores = [r["relevance_score"] for r in response.json()["results"]]
        assert scores == sorted(scores, reverse=True)


def _elements(sizes: list[int]) -> bytes:
    return b"".join(struct.pack("<I", n) + b"x" * n for n in sizes)


binary_tensors = st.fixed_dictionaries({
    "name": st.sampled_from(["text", "prompt", "input_ids"]),
    "datatype": st.sampled_from(["BYTES", "INT64"]),
    "shape": st.lists(st.integers(0, 3) | st.sampled_from([2 ** 31, 2 ** 62, 2 ** 63, 10 ** 30]), min_size=1,
                      max_size=2),
    # BYTES elements: a few short texts, or many zero-length ones (the probe: 15 million in a shape of [1])
    "raw": st.lists(st.integers(0, 6), max_size=4).map(_elements)
           | st.integers(1_000, 200_000).map(lambda n: b"\0\0\0\0" * n) | st.binary(max_size=24)})
# Inference-Header-Content-Length: the truth, or a lie (beyond the body, negative, a digit int() refuses, text)
header_lengths = st.sampled_from(["true", "true", "+1", "-1", "\u00b2", "\u0663", "1e3", "0x10", "99999999999999999999"])


@FUZZ
@given(tensors=st.lists(binary_tensors, min_size=1, max_size=2), length=header_lengths,
       model=st.sampled_from([CLASSIFIER, GPT]), binary_flag=st.booleans())
def test_fuzzed_binary_infer_bodies(server: ServerProcess, client: httpx.Client, tensors: list[dict[str, Any]],
                                    length: str, model: str, binary_flag: bool) -> None:
    """Triton's binary extension with hostile tails and lying headers: 400 / 413, never 500 or a hang."""
    described = [{"name": t["name"], "datatype": t["datatype"], "shape": t["shape"],
                  "parameters": {"binary_data_size": len(t["raw"])}} for t in tensors]
    header = dumps({"inputs": described, "parameters": {"binary_data_output": binary_flag}}).encode()
    body = header + b"".join(t["raw"] for t in tensors)
    value = {"true": str(len(header)), "+1": str(len(body) + 1)}.get(length, length)
    response = client.post(f"{server.http_url}/v2/models/{model}/infer", content=body,
                           headers={"Inference-Header-Content-Length": value.encode()})
    _check(response, openai_shape=False)


def test_server_alive_after_fuzzing(server: ServerProcess, client: httpx.Client) -> None:
    _alive(server, client)
    assert "Traceback" not in "".join(server.lines), server.output(80)
