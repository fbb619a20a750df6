"""The HTTP front door end to end: the OpenAI API with the real `openai` client, and plain HTTP for what clients
never send (malformed JSON, wrong content types, oversize bodies, unknown routes, bad tokens): each a clear 4xx,
the server healthy afterwards.

Real server processes on free localhost ports; gRPC answers (tritonclient.grpc, the task API) are the reference
for HTTP answers: one data plane behind both. (KServe v2 REST is tests/e2e/kserve/test_kserve_rest.py; the module's
default server and task stub are tests/e2e/conftest.py's.)
"""
from __future__ import annotations

import asyncio
import http.client
import json
import shutil
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import grpc
import httpx2 as httpx
import onnxruntime as ort
import openai
import pytest
import tritonclient.http as thttp
from tests.server_process import ServerProcess, repository_with
from tokenizers import Tokenizer
from tritonclient.utils import InferenceServerException

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc
from testing.launch import prometheus_sample
from testing.offline import greedy_with_logprobs, prompt_distributions, prompt_logprobs
from testing.tls import self_signed
from tests.door_calls import classifier_feeds, grpc_greedy_text, http_request, post_json, triton_inputs

CLASSIFIER, FILL_MASK, GPT = "tiny-classifier", "tiny-fill-mask", "tiny-gpt"
TOKEN = "s3cret-token"
SMALL_BODY = 65536


@pytest.fixture(scope="module")
def oai(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def strict(tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """TLS, a bearer token, a 64 KiB body limit, 64 generation tokens in flight per decoder."""
    root = tmp_path_factory.mktemp("strict")
    cert, key = self_signed(root, "server")
    repo = repository_with(tiny_repository, root / "repo", CLASSIFIER, GPT)
    proc = ServerProcess(repo, ["--http-port", "0", "--tls-cert", str(cert), "--tls-key", str(key),
                                "--max-message-bytes", str(SMALL_BODY), "--max-tokens-in-flight", "64"],
                         root_cert=cert, env={"ORTSERVE_AUTH_TOKEN": TOKEN})
    proc.cert = cert  # type: ignore[attr-defined]
    try:
        yield proc
    finally:
        proc.stop()


def test_http_port_flag_errors_are_one_line_exit_2(tiny_repository: Path) -> None:
    import socket
    import subprocess
    import sys

    from tests.server_process import ROOT

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        for args, needle in ((["--http-port", "70000"], "--http-port: must be in -1..65535"),
                             (["--http-port", str(busy.getsockname()[1])], "--http-port: cannot serve on")):
            done = subprocess.run([sys.executable, "-m", "server", "--repository", str(tiny_repository), "--port", "0",
                                   "--metrics-port", "-1", "--poll-interval", "0", *args], cwd=ROOT,
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 2 and needle in done.stderr and "Traceback" not in done.stderr, done.stderr
    finally:
        busy.close()


# ---------------------------------------------------------------- the HTTP port's connections

def test_small_responses_are_not_held_by_nagle(server: ServerProcess) -> None:
    """TCP_NODELAY on the server's connections: with Nagle on, each keep-alive answer waited ~40 ms for the
    client's delayed ACK (the listening socket must be created with IPPROTO_TCP for asyncio to switch it off)."""
    conn = http.client.HTTPConnection(server.host, server.http_port, timeout=30)
    times = []
    try:
        for _ in range(31):
            started = time.perf_counter()
            conn.request("GET", "/v2/health/live")
            response = conn.getresponse()
            assert response.status == 200 and response.read()
            times.append(time.perf_counter() - started)
    finally:
        conn.close()
    assert sorted(times)[15] < 0.030, sorted(times)


# ---------------------------------------------------------------- malformed requests: 4xx, never 500


@pytest.mark.parametrize("method, path, body, headers, status, needle", [
    ("POST", f"/v2/models/{CLASSIFIER}/infer", b'{"inputs": [', {"content-type": "application/json"}, 400,
     "malformed JSON"),
    ("POST", f"/v2/models/{CLASSIFIER}/infer", b'{"a": "\xff"}', {}, 400, "not UTF-8"),
    ("POST", f"/v2/models/{CLASSIFIER}/infer", b"[1, 2]", {}, 400, "body: must be a JSON object"),
    ("POST", f"/v2/models/{CLASSIFIER}/infer", b"{}", {"content-type": "text/plain"}, 415, "content-type"),
    ("POST", f"/v2/models/{CLASSIFIER}/infer", b"{}", {"content-encoding": "br"}, 415, "content-encoding"),
    ("POST", "/v1/completions", b'{"model": "tiny-gpt", "prompt": "a"}', {"content-type": "text/plain"}, 415,
     "content-type"),
    ("POST", "/v1/completions", b'{"model": ', {"content-type": "application/json"}, 400, "malformed JSON"),
    ("POST", "/v1/completions", b"[]", {"content-type": "application/json"}, 400, "body: must be a JSON object"),
    ("POST", "/v1/completions", b'{"prompt": "a"}', {"content-type": "application/json"}, 400, "model: is required"),
    ("GET", "/v2/nowhere", None, {}, 404, "no route"),
    ("GET", "/v1/nowhere", None, {}, 404, "no route"),
    ("GET", "/v2/models/nope/ready", None, {}, 404, "nope"),
    ("POST", "/v2/models/nope/infer", b'{"inputs": [{"name": "a", "datatype": "INT64", "shape": [1], "data": [1]}]}',
     {}, 404, "unknown model 'nope'"),
    ("GET", f"/v2/models/{CLASSIFIER}/versions/007", None, {}, 400, "version"),
    ("GET", "/v1/completions", None, {}, 405, "GET is not allowed"),
    ("POST", f"/v2/models/{CLASSIFIER}/infer", b"{}", {"content-length": "99999999999"}, 413, "body"),
])
def test_malformed_requests_are_clear_4xx(server: ServerProcess, method: str, path: str, body: bytes | None,
                                          headers: dict[str, str], status: int, needle: str) -> None:
    got, response_headers, content = http_request(server.http_url + path, method, body, headers)
    assert got == status, content
    assert response_headers["content-type"] == "application/json"
    error = json.loads(content)["error"]
    message = error["message"] if path.startswith("/v1") else error
    assert needle in message, message
    if path.startswith("/v1"):
        assert error["type"] and error["code"] == status
    assert http_request(server.http_url + "/v2/health/ready")[0] == 200  # still healthy
    assert "Traceback" not in "".join(server.lines)  # nothing reached the 500 path


def test_oversize_bodies_are_413_declared_or_chunked(strict: ServerProcess) -> None:
    cafile = strict.cert  # type: ignore[attr-defined]
    auth = {"authorization": f"Bearer {TOKEN}"}
    big = json.dumps({"model": GPT, "prompt": "x" * (SMALL_BODY + 10)}).encode()
    status, _, content = http_request(f"{strict.http_url}/v1/completions", "POST", big,
                                  {**auth, "content-type": "application/json"}, cafile)
    assert status == 413 and b"--max-message-bytes" in content

    def chunks() -> Iterator[bytes]:
        for _ in range(20):
            yield b"x" * 8192

    conn = http.client.HTTPSConnection(strict.host, strict.http_port, timeout=60,
                                       context=ssl.create_default_context(cafile=str(cafile)))
    try:
        conn.request("POST", f"/v2/models/{CLASSIFIER}/infer", body=chunks(), headers=auth, encode_chunked=True)
        response = conn.getresponse()
        assert response.status == 413 and b"more than" in response.read()
    finally:
        conn.close()
    assert http_request(f"{strict.http_url}/v2/health/ready", cafile=cafile)[0] == 200


def test_vllm_health_and_metrics_routes(server: ServerProcess, oai: openai.OpenAI) -> None:
    """GET /health and GET /metrics on the HTTP port, where vLLM serves them: the same counts as --metrics-port."""
    status, _, body = http_request(server.http_url + "/health")
    assert status == 200 and body == b""
    oai.completions.create(model=GPT, prompt="a", max_tokens=1)
    status, headers, body = http_request(server.http_url + "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    labels = {"model": GPT, "method": "http.Completions", "code": "OK"}
    assert prometheus_sample(body.decode(), "ortserve_requests_total", **labels) == \
        server.metric("ortserve_requests_total", **labels) >= 1


def test_bearer_token_and_tls(strict: ServerProcess) -> None:
    cafile = strict.cert  # type: ignore[attr-defined]
    url = f"{strict.http_url}/v2/models/{CLASSIFIER}"
    assert strict.http_url.startswith("https://")
    assert http_request(f"{strict.http_url}/v2/health/live", cafile=cafile)[0] == 200  # health stays open
    assert http_request(f"{strict.http_url}/health", cafile=cafile)[0] == 200            # vLLM's too
    # /metrics names every model: it needs the token (docs/protocol.md, Authentication)
    assert http_request(f"{strict.http_url}/metrics", cafile=cafile)[0] == 401
    assert b"ortserve_requests_total" in http_request(f"{strict.http_url}/metrics", cafile=cafile,
                                                  headers={"authorization": f"Bearer {TOKEN}"})[2]
    status, headers, content = http_request(url, cafile=cafile)
    assert status == 401 and "missing" in json.loads(content)["error"] and headers["www-authenticate"] == "Bearer"
    status, _, content = http_request(url, headers={"authorization": "Bearer wrong"}, cafile=cafile)
    assert status == 401 and "invalid bearer token" in json.loads(content)["error"]
    assert http_request(url, headers={"authorization": f"Bearer {TOKEN}"}, cafile=cafile)[0] == 200
    with pytest.raises(ssl.SSLError):  # the self-signed certificate is not in the system's trust store
        http_request(url)

    client = thttp.InferenceServerClient(f"{strict.host}:{strict.http_port}", ssl=True,
                                         ssl_options={"ca_certs": str(cafile)})
    try:
        result = client.infer(CLASSIFIER, triton_inputs(thttp, classifier_feeds([[2, 9, 3]])), headers={
            "authorization": f"Bearer {TOKEN}"})
        assert result.as_numpy("logits").shape == (1, 3)
        with pytest.raises(InferenceServerException) as info:
            client.infer(CLASSIFIER, triton_inputs(thttp, classifier_feeds([[2, 9, 3]])))
        assert info.value.status() == "401"
    finally:
        client.close()

    tls = httpx.Client(verify=ssl.create_default_context(cafile=str(cafile)))
    bad = openai.OpenAI(base_url=f"{strict.http_url}/v1", api_key="wrong", max_retries=0, http_client=tls)
    with pytest.raises(openai.AuthenticationError) as auth_info:
        bad.models.list()
    assert auth_info.value.status_code == 401 and auth_info.value.body["type"] == "authentication_error"
    good = openai.OpenAI(base_url=f"{strict.http_url}/v1", api_key=TOKEN, max_retries=0, http_client=tls)
    assert {m.id for m in good.models.list()} == {CLASSIFIER, GPT}


# ---------------------------------------------------------------- the OpenAI API with the openai client


def test_openai_models(oai: openai.OpenAI) -> None:
    models = {m.id: m for m in oai.models.list()}
    assert set(models) == {CLASSIFIER, FILL_MASK, GPT}
    assert models[GPT].owned_by == "ortserve" and models[GPT].object == "model"
    assert oai.models.retrieve(GPT).id == GPT
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("nope")


def test_greedy_completion_equals_grpc_generate(oai: openai.OpenAI, tasks: pb_grpc.TaskServiceStub) -> None:
    prompt = "Shall I compare thee"
    ref = tasks.Generate(pb.GenerateRequest(model=GPT, prompt=prompt, parameters=pb.GenerationParameters(
        max_new_tokens=12, temperature=0.0, ignore_eos=True)))
    done = oai.completions.create(model=GPT, prompt=prompt, max_tokens=12, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert done.choices[0].text == ref.text and done.choices[0].finish_reason == "length"
    assert done.usage.prompt_tokens == ref.usage.prompt_tokens and done.usage.completion_tokens == 12
    assert done.usage.total_tokens == ref.usage.prompt_tokens + 12
    assert done.object == "text_completion" and done.model == GPT and done.id.startswith("cmpl-")

    stream = oai.completions.create(model=GPT, prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                    stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ref.text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12

    two = oai.completions.create(model=GPT, prompt=[prompt, "To be"], max_tokens=4, temperature=0,
                                 extra_body={"ignore_eos": True})
    assert [c.index for c in two.choices] == [0, 1]
    assert [c.text for c in two.choices] == [grpc_greedy_text(tasks, prompt, 4), grpc_greedy_text(tasks, "To be", 4)]
    assert two.usage.completion_tokens == 8
    echoed = oai.completions.create(model=GPT, prompt=prompt, max_tokens=3, temperature=0, echo=True,
                                    extra_body={"ignore_eos": True})
    assert echoed.choices[0].text == prompt + grpc_greedy_text(tasks, prompt, 3)


def test_usage_reports_the_prompt_tokens_found_cached(oai: openai.OpenAI, tasks: pb_grpc.TaskServiceStub) -> None:
    """A prompt that starts with what a free cache slot holds (prefix caching): OpenAI's
    usage.prompt_tokens_details.cached_tokens, and the task API's usage.cached_prompt_tokens, say how much."""
    context = "Is this a dagger which I see before me, the handle toward my hand? Come, let me clutch thee."
    first = oai.completions.create(model=GPT, prompt=context, max_tokens=3, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second = oai.completions.create(model=GPT, prompt=context + " I have thee not", max_tokens=3, temperature=0,
                                    stream=True, stream_options={"include_usage": True})
    usage = [e.usage for e in second if e.usage is not None][-1]
    assert first.usage.prompt_tokens - 2 <= usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens
    third = tasks.Generate(pb.GenerateRequest(model=GPT, prompt=context + " and yet I see thee still",
                                              parameters=pb.GenerationParameters(max_new_tokens=2)))
    assert first.usage.prompt_tokens - 2 <= third.usage.cached_prompt_tokens < third.usage.prompt_tokens


def test_streaming_several_prompts_interleaves_choices(oai: openai.OpenAI, tasks: pb_grpc.TaskServiceStub) -> None:
    prompts = ["Shall I compare thee", "To be", "Now is the winter"]
    stream = oai.completions.create(model=GPT, prompt=prompts, max_tokens=6, temperature=0, stream=True,
                                    stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    texts = ["", "", ""]
    finished = []
    usage = None
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason:
                finished.append(choice.index)
        usage = chunk.usage or usage
    assert texts == [grpc_greedy_text(tasks, p, 6) for p in prompts]
    assert sorted(finished) == [0, 1, 2] and usage.completion_tokens == 18


def test_stream_ends_with_done_event(server: ServerProcess) -> None:
    body = {"model": GPT, "prompt": "To be", "max_tokens": 5, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{server.http_url}/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"


def test_stream_events_stay_one_line_with_unicode_line_separators(server: ServerProcess) -> None:
    """Text holding NEL, LINE SEPARATOR and PARAGRAPH SEPARATOR (which httpx's iter_lines and str.splitlines end
    lines at, though SSE does not) still arrives as one `data:` line an event, and the echo gives them back."""
    prompt = "one\u2028two\u0085three\u2029four"
    body = {"model": GPT, "prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 4, "temperature": 0,
            "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{server.http_url}/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines), lines
    events = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    assert "".join(c["text"] for e in events for c in e["choices"]).startswith(prompt)


def test_stop_seed_and_logprobs(oai: openai.OpenAI) -> None:
    prompt = "Now is the winter"
    full = oai.completions.create(model=GPT, prompt=prompt, max_tokens=16, temperature=0,
                                  extra_body={"ignore_eos": True}).choices[0].text
    stop = full[5:8]
    cut = oai.completions.create(model=GPT, prompt=prompt, max_tokens=16, temperature=0, stop=[stop],
                                 extra_body={"ignore_eos": True}).choices[0]
    assert cut.finish_reason == "stop" and cut.text == full[:full.index(stop)]

    sampled = [oai.completions.create(model=GPT, prompt=prompt, max_tokens=10, temperature=1.0, seed=7,
                                      extra_body={"ignore_eos": True}).choices[0].text for _ in range(2)]
    assert sampled[0] == sampled[1]

    scored = oai.completions.create(model=GPT, prompt=prompt, max_tokens=6, temperature=0, logprobs=2,
                                    extra_body={"ignore_eos": True})
    lp = scored.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert all(x <= 0 for x in lp.token_logprobs) and all(1 <= len(t) <= 2 for t in lp.top_logprobs)
    # Greedy: the chosen token is the best of its top list.
    assert all(max(top.values()) == pytest.approx(chosen, abs=1e-5)
               for top, chosen in zip(lp.top_logprobs, lp.token_logprobs))


def test_completion_penalties_and_logit_bias(oai: openai.OpenAI) -> None:
    """OpenAI's presence / frequency penalties and logit_bias reach the sampler: the random model repeats its
    tokens greedily, its logits lie within 2 of each other, so a penalty of 2 on every generated token makes
    each one new; a bias of 100 makes one token win every step."""
    def tokens(**kwargs: Any) -> list[str]:
        done = oai.completions.create(model=GPT, prompt="To be", max_tokens=8, temperature=0, logprobs=1,
                                      extra_body={"ignore_eos": True}, **kwargs)
        return done.choices[0].logprobs.tokens

    plain = tokens()
    assert len(set(plain)) < len(plain), plain
    for penalty in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}):
        got = tokens(**penalty)
        assert got[0] == plain[0], (penalty, got)            # the prompt's tokens do not count
        whole = [t for t in got if "\ufffd" not in t]        # (part-character tokens all print as U+FFFD)
        assert len(set(whole)) == len(whole) and len(whole) >= 4, (penalty, got)
    forced = [tokens(logit_bias={str(token): 100}) for token in (300, 301)]   # merges, not single bytes
    assert all(len(set(f)) == 1 for f in forced) and forced[0][0] != forced[1][0], forced


def test_completion_vllm_sampling_extras(oai: openai.OpenAI) -> None:
    """stop_token_ids ends on a token (its text left out); min_tokens holds it back; min_p = 1 keeps only the
    likeliest token, so sampling at temperature 1 gives the greedy text."""
    def forced(**extra: Any) -> Any:          # token 300 wins every step it may
        return oai.completions.create(model=GPT, prompt="To be", max_tokens=8, temperature=0,
                                      logit_bias={"300": 100}, extra_body=extra)

    stopped = forced(stop_token_ids=[300])
    assert (stopped.choices[0].text, stopped.choices[0].finish_reason) == ("", "stop")
    assert forced(stop_token_ids=[300], min_tokens=4).usage.completion_tokens == 5   # four others, then 300
    greedy = oai.completions.create(model=GPT, prompt="To be", max_tokens=8, temperature=0,
                                    extra_body={"ignore_eos": True}).choices[0].text
    kw: dict[str, Any] = {"model": GPT, "prompt": "To be", "max_tokens": 8, "temperature": 1.0}
    top_only = [oai.completions.create(seed=s, extra_body={"min_p": 1.0, "ignore_eos": True}, **kw).choices[0].text
                for s in (1, 2)]
    assert top_only == [greedy, greedy]
    assert oai.completions.create(seed=1, extra_body={"ignore_eos": True}, **kw).choices[0].text != greedy


def test_completion_token_id_prompts_answer_as_their_text(oai: openai.OpenAI, tiny_repository: Path) -> None:
    """A prompt of token ids (one, or a list of them) is what its text tokenizes to, so the answers match."""
    tokenizer = Tokenizer.from_file(str(tiny_repository / GPT / "1" / "tokenizer.json"))
    texts = ["To be, or not to be", "Romeo"]
    ids = [tokenizer.encode(t).ids for t in texts]
    kw: dict[str, Any] = {"max_tokens": 6, "temperature": 0, "extra_body": {"ignore_eos": True}}
    by_text = oai.completions.create(model=GPT, prompt=texts, **kw)
    by_ids = oai.completions.create(model=GPT, prompt=ids, **kw)
    assert [c.text for c in by_ids.choices] == [c.text for c in by_text.choices]
    assert by_ids.usage.prompt_tokens == by_text.usage.prompt_tokens == len(ids[0]) + len(ids[1])
    assert oai.completions.create(model=GPT, prompt=ids[1], **kw).choices[0].text == by_text.choices[1].text


def test_tokenize_and_detokenize_as_vllm(server: ServerProcess, tiny_repository: Path) -> None:
    tokenizer = Tokenizer.from_file(str(tiny_repository / GPT / "1" / "tokenizer.json"))
    text = "To be, or not to be: é漢"
    status, body = post_json(f"{server.http_url}/tokenize", {"model": GPT, "prompt": text})
    max_length = json.loads((tiny_repository / GPT / "1" / "model.json").read_text())["max_length"]
    encoding = tokenizer.encode(text)
    assert status == 200 and body == {"count": len(encoding.ids), "max_model_len": max_length,
                                      "tokens": encoding.ids, "special": [False] * len(encoding.ids),
                                      "offsets": [list(o) for o in encoding.offsets]}
    status, back = post_json(f"{server.http_url}/detokenize", {"model": GPT, "tokens": body["tokens"]})
    assert status == 200 and back == {"prompt": text}
    for url, payload, code, param in (
            ("/detokenize", {"model": GPT, "tokens": [1, 10 ** 9]}, 400, "tokens[1]"),
            ("/tokenize", {"model": CLASSIFIER, "prompt": "a" * ((max_length + 1) * 100 + 1)}, 400, "prompt"),
            ("/tokenize", {"model": "nope", "prompt": "a"}, 404, None),
            ("/tokenize", {"model": GPT}, 400, "prompt"),
            ("/tokenize", {"model": GPT, "prompt": "a" * ((max_length + 1) * 100 + 1)}, 400,
             "prompt")):  # not tokenized
        status, error = post_json(f"{server.http_url}{url}", payload)
        assert status == code and (param is None or error["error"]["param"] == param), (url, payload, error)


def test_completion_n_choices_in_openai_order_with_seed_plus_j(oai: openai.OpenAI) -> None:
    """n completions of each prompt: choice k answers prompt k // n, drawn with seed + k % n; each prompt's
    tokens count once in usage. Streamed, the same texts arrive under the same indices."""
    prompts, kw = ["To be", "Romeo"], {"max_tokens": 6, "temperature": 1.0, "extra_body": {"ignore_eos": True}}
    many = oai.completions.create(model=GPT, prompt=prompts, n=2, seed=11, **kw)
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    alone = [oai.completions.create(model=GPT, prompt=p, seed=11 + j, **kw) for p in prompts for j in range(2)]
    assert [c.text for c in many.choices] == [a.choices[0].text for a in alone]
    assert len({c.text for c in many.choices[:2]}) == 2                  # two draws, not one draw twice
    assert many.usage.prompt_tokens == alone[0].usage.prompt_tokens + alone[2].usage.prompt_tokens
    assert many.usage.completion_tokens == 4 * 6
    texts = ["", "", "", ""]
    for chunk in oai.completions.create(model=GPT, prompt=prompts, n=2, seed=11, stream=True, **kw):
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == [c.text for c in many.choices]
    greedy = oai.completions.create(model=GPT, prompt="To be", n=3, max_tokens=6, temperature=0)
    assert len({c.text for c in greedy.choices}) == 1


def test_n_completions_of_one_prompt_prefill_it_once_and_answer_as_offline(
        oai: openai.OpenAI, server: ServerProcess, tiny_repository: Path) -> None:
    """The n completions arrive together: the first is prefilled, the others copy its slot's keys/values for all
    but the prompt's last token (which rides the next decode call), so the prompt is computed once, not n times.
    Greedy ids and logprobs still equal an offline full prefill."""
    prompt = "Now is the winter of our discontent made glorious summer by this sun of York, and all the clouds"
    before = server.metric("ortserve_prefix_reused_tokens_total", model=GPT)
    many = oai.completions.create(model=GPT, prompt=prompt, n=3, max_tokens=8, temperature=0, logprobs=1,
                                  extra_body={"ignore_eos": True})
    reused = server.metric("ortserve_prefix_reused_tokens_total", model=GPT) - before
    ids = Tokenizer.from_file(str(tiny_repository / GPT / "1" / "tokenizer.json")).encode(prompt).ids
    assert many.usage.prompt_tokens == len(ids) > 17          # past the 16 tokens a reuse needs
    assert reused == 2 * (len(ids) - 1), f"{reused} prompt tokens reused"
    pkg = tiny_repository / GPT / "1"
    want = greedy_with_logprobs(ort.InferenceSession(str(pkg / "model.onnx"), providers=["CPUExecutionProvider"]),
                                json.loads((pkg / "model.json").read_text()), ids, 8, stop_at_eos=False)
    for choice in many.choices:
        got = choice.logprobs.token_logprobs
        assert choice.text == Tokenizer.from_file(str(pkg / "tokenizer.json")).decode([t for t, _ in want])
        assert max(abs(a - b) for a, (_, b) in zip(got, want)) < 1e-4


def _gpt_reference(tiny_repository: Path) -> tuple[ort.InferenceSession, dict[str, Any], Tokenizer]:
    pkg = tiny_repository / GPT / "1"
    return (ort.InferenceSession(str(pkg / "model.onnx"), providers=["CPUExecutionProvider"]),
            json.loads((pkg / "model.json").read_text()), Tokenizer.from_file(str(pkg / "tokenizer.json")))


def test_echo_with_logprobs_scores_the_prompt_as_offline_streamed_or_not(
        oai: openai.OpenAI, tiny_repository: Path) -> None:
    """OpenAI's echo + logprobs: the prompt's tokens come first in the logprobs, the first with null (no context),
    each other one scored as one offline run over the whole prompt scores it, alternatives best first."""
    session, manifest, tok = _gpt_reference(tiny_repository)
    prompt = "To be, or not to be, that is the question: whether tis nobler in the mind"
    ids = tok.encode(prompt).ids
    want, best = prompt_logprobs(session, manifest, ids)
    kw = {"model": GPT, "prompt": prompt, "echo": True, "logprobs": 2, "max_tokens": 3, "temperature": 0,
          "extra_body": {"ignore_eos": True}}
    out = oai.completions.create(**kw)
    choice = out.choices[0]
    lp = choice.logprobs
    assert choice.text.startswith(prompt) and len(lp.tokens) == len(ids) + 3
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert max(abs(a - b) for a, b in zip(lp.token_logprobs[1:len(ids)], want)) < 1e-4
    for k, top in enumerate(lp.top_logprobs[1:len(ids)]):
        assert len(top) == 2 and next(iter(top)) == tok.decode([best[k]])    # the likeliest first
        assert max(top.values()) >= lp.token_logprobs[k + 1] - 1e-6
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    streamed: dict[str, list] = {"tokens": [], "token_logprobs": [], "text_offset": []}
    text = ""
    for chunk in oai.completions.create(stream=True, **kw):
        c = chunk.choices[0]
        text += c.text
        for key in streamed:
            streamed[key] += getattr(c.logprobs, key) if c.logprobs else []
    assert text == choice.text and streamed == {key: getattr(lp, key) for key in streamed}


def test_lm_eval_loglikelihood_requests(oai: openai.OpenAI, tiny_repository: Path) -> None:
    """What lm-evaluation-harness's local-completions model sends to score a continuation: token-id prompts
    (context + continuation), echo, logprobs 1, max_tokens 1, several prompts in one request. It reads
    token_logprobs[ctxlen:-1] (the continuation's logprobs) and compares top_logprobs with the tokens (greedy?)."""
    session, manifest, tok = _gpt_reference(tiny_repository)
    pairs = [("The quality of mercy is not", " strained"), ("Now is the winter of our", " discontent"),
             ("O Romeo, Romeo, wherefore art", " thou Romeo")]
    requests = [(tok.encode(c).ids, tok.encode(c + x).ids) for c, x in pairs]
    out = oai.completions.create(model=GPT, prompt=[whole for _, whole in requests], echo=True, logprobs=1,
                                 max_tokens=1, temperature=0, seed=1234)
    assert len(out.choices) == len(pairs)
    for choice, (context, whole) in zip(out.choices, requests):
        ctxlen = len(context)
        want, best = prompt_logprobs(session, manifest, whole)
        got = choice.logprobs.token_logprobs[ctxlen:-1]
        assert len(got) == len(whole) - ctxlen
        assert max(abs(a - b) for a, b in zip(got, want[ctxlen - 1:])) < 1e-4
        greedy = all(next(iter(top)) == token for top, token in
                     zip(choice.logprobs.top_logprobs[ctxlen:-1], choice.logprobs.tokens[ctxlen:-1]))
        assert greedy == (best[ctxlen - 1:] == whole[ctxlen:])
        assert choice.text.startswith(tok.decode(whole))


def test_vllm_prompt_logprobs_give_each_prompt_tokens_logprob_rank_and_alternatives(
        oai: openai.OpenAI, tiny_repository: Path) -> None:
    """vLLM's prompt_logprobs: null, then per prompt token {id: {logprob, rank, decoded_token}} for the token and its
    k likeliest alternatives (ranks 1..k). The rank is 1 + how many tokens the model found likelier, from an offline
    run over the whole prompt; with echo + logprobs too, each keeps its own number of alternatives."""
    session, manifest, tok = _gpt_reference(tiny_repository)
    prompt = "O Romeo, Romeo, wherefore art thou Romeo? Deny thy father and refuse thy name"
    ids = tok.encode(prompt).ids
    rows = prompt_distributions(session, manifest, ids)
    want_ranks = [int((rows[i] > rows[i, t]).sum()) + 1 for i, t in enumerate(ids[1:])]
    want, best = prompt_logprobs(session, manifest, ids)
    response = httpx.post(f"{oai.base_url}completions", timeout=60, json={
        "model": GPT, "prompt": prompt, "max_tokens": 1, "prompt_logprobs": 3, "echo": True, "logprobs": 1})
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    scores = choice["prompt_logprobs"]
    assert scores[0] is None and len(scores) == len(ids)
    for entry, token, lp, rank, top in zip(scores[1:], ids[1:], want, want_ranks, best):
        assert entry[str(token)]["rank"] == rank and abs(entry[str(token)]["logprob"] - lp) < 1e-4
        assert entry[str(token)]["decoded_token"] == tok.decode([token])
        ranked = sorted((e["rank"], int(t)) for t, e in entry.items() if t != str(token) or e["rank"] <= 3)
        assert [r for r, _ in ranked][:1] == [1] and ranked[0][1] == top and 3 <= len(entry) <= 4
    assert all(top is None or len(top) == 1 for top in choice["logprobs"]["top_logprobs"])   # echo keeps its 1
    with pytest.raises(openai.BadRequestError) as info:
        oai.completions.create(model=GPT, prompt="a", stream=True, extra_body={"prompt_logprobs": 1})
    assert info.value.body["param"] == "prompt_logprobs"


def test_max_tokens_zero_with_echo_scores_the_prompt_and_generates_nothing(
        oai: openai.OpenAI, tiny_repository: Path) -> None:
    """What older lm-evaluation-harness sends (echo, max_tokens 0, logprobs): the prompt back, scored, nothing more."""
    session, manifest, tok = _gpt_reference(tiny_repository)
    prompt = "Once more unto the breach, dear friends, once more"
    ids = tok.encode(prompt).ids
    want, _ = prompt_logprobs(session, manifest, ids)
    out = oai.completions.create(model=GPT, prompt=[ids], echo=True, max_tokens=0, logprobs=3, temperature=0)
    choice = out.choices[0]
    assert choice.text == tok.decode(ids) and choice.finish_reason == "length"
    assert len(choice.logprobs.tokens) == len(ids) and choice.logprobs.token_logprobs[0] is None
    assert max(abs(a - b) for a, b in zip(choice.logprobs.token_logprobs[1:], want)) < 1e-4
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(ids), 0)
    for kwargs in ({"echo": False}, {"echo": True, "stream": True}):
        with pytest.raises(openai.BadRequestError) as info:
            oai.completions.create(model=GPT, prompt=prompt, max_tokens=0, **kwargs)
        assert info.value.body["param"] == "max_tokens"


def test_a_scored_prompt_is_prefilled_whole_even_when_its_prefix_is_cached(
        oai: openai.OpenAI, tiny_repository: Path) -> None:
    """Prompt logprobs need the logits at every prompt position, so no prefix is copied for such a request."""
    session, manifest, tok = _gpt_reference(tiny_repository)
    prompt = "Friends, Romans, countrymen, lend me your ears; I come to bury Caesar, not to praise him."
    oai.completions.create(model=GPT, prompt=prompt, max_tokens=2)                  # its slot now holds the prompt
    again = oai.completions.create(model=GPT, prompt=prompt, max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens > 16                     # (prefix caching is on)
    scored = oai.completions.create(model=GPT, prompt=prompt, echo=True, logprobs=0, max_tokens=2)
    assert scored.usage.prompt_tokens_details.cached_tokens == 0
    want, _ = prompt_logprobs(session, manifest, tok.encode(prompt).ids)
    got = scored.choices[0].logprobs.token_logprobs[1:len(want) + 1]
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-4


def test_a_refused_choice_cancels_the_requests_other_choices(tiny_repository: Path, tmp_path: Path) -> None:
    """n = 3 completions of 1 + 30 tokens against a budget of 64 tokens in flight: the request as a whole can
    never be admitted (400 naming `prompt`, not a retryable 429), and none of its choices starts: no token is
    generated for an answer nobody reads."""
    repo = repository_with(tiny_repository, tmp_path / "repo", GPT)
    with ServerProcess(repo, ["--http-port", "0", "--metrics-port", "0", "--max-tokens-in-flight", "64"]) as proc:
        client = openai.OpenAI(base_url=f"{proc.http_url}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError) as never:
            client.completions.create(model=GPT, prompt="a", n=3, max_tokens=30, extra_body={"ignore_eos": True})
        assert never.value.body["param"] == "prompt" and "max_tokens_in_flight 64" in never.value.body["message"]
        time.sleep(0.5)
        assert proc.metric("ortserve_generated_tokens_total", model=GPT) == 0
        assert proc.metric("ortserve_tokens_in_flight", model=GPT) == 0


def test_chat_refused_without_template(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model=GPT, messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 400 and "no chat template" in info.value.body["message"]
    assert info.value.body["param"] == "model"


@pytest.mark.parametrize("kwargs, param", [
    ({"temperature": -1}, "temperature"),
    ({"max_tokens": "many"}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"top_p": 0}, "top_p"),
    ({"n": 17}, "n"),
    ({"n": 0}, "n"),
    ({"n": 2, "best_of": 3}, "best_of"),
    ({"logprobs": 9}, "logprobs"),
    ({"stop": [1, 2]}, "stop"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": "lots"}, "frequency_penalty"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias[5]"),
    ({"prompt": [[1, "a"]]}, "prompt"),
    ({"prompt": [1, 10 ** 9]}, "prompt[1]"),
])
def test_completion_bad_parameters_are_400_naming_the_field(oai: openai.OpenAI, kwargs: dict[str, Any],
                                                            param: str) -> None:
    args = {"model": GPT, "prompt": "a", **kwargs}
    with pytest.raises(openai.BadRequestError) as info:
        oai.completions.create(**args)
    assert info.value.body["param"] == param and info.value.body["type"] == "invalid_request_error"


def test_completion_unknown_model_is_404(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        oai.completions.create(model="nope", prompt="a")
    assert "nope" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as wrong_task:
        oai.completions.create(model=CLASSIFIER, prompt="a")
    assert "not generate" in wrong_task.value.body["message"]


def test_overload_is_429(strict: ServerProcess) -> None:
    """Admission control of the generation engine: tokens beyond --max-tokens-in-flight (64) -> 429 while others
    hold them; one request that could never fit the budget -> 400."""
    tls = httpx.Client(verify=ssl.create_default_context(cafile=str(strict.cert)))  # type: ignore[attr-defined]
    client = openai.OpenAI(base_url=f"{strict.http_url}/v1", api_key=TOKEN, max_retries=0, http_client=tls)
    with pytest.raises(openai.BadRequestError) as never:
        client.completions.create(model=GPT, prompt="a", max_tokens=100)
    assert never.value.status_code == 400 and "max_tokens_in_flight 64" in never.value.body["message"]

    def one(_: int) -> str:  # 1 + 40 tokens each: two at once exceed 64
        try:
            client.completions.create(model=GPT, prompt="a", max_tokens=40, extra_body={"ignore_eos": True})
            return "ok"
        except openai.RateLimitError as exc:
            assert exc.status_code == 429 and exc.body["type"] == "rate_limit_error"
            assert "at capacity" in exc.body["message"]
            return "429"
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(one, range(8)))
    assert "ok" in outcomes and "429" in outcomes, outcomes
    assert client.completions.create(model=GPT, prompt="a", max_tokens=8).usage.completion_tokens >= 1


def test_deadlines_and_request_metrics(server: ServerProcess, oai: openai.OpenAI) -> None:
    """HTTP requests count in the same Prometheus series as gRPC ones; a timeout header is a deadline."""
    def count(code: str) -> float:
        return server.metric("ortserve_requests_total", model=GPT, method="http.Completions", code=code)

    ok, late = count("OK"), count("DEADLINE_EXCEEDED")
    oai.completions.create(model=GPT, prompt="a", max_tokens=2)
    url = f"{server.http_url}/v1/completions"
    status, body = post_json(url, {"model": GPT, "prompt": "a", "max_tokens": 2},
                         headers={"x-request-timeout": "0.000001"})
    assert status == 504 and body["error"]["type"] == "timeout"
    status, body = post_json(url, {"model": GPT, "prompt": "a"}, headers={"x-request-timeout": "soon"})
    assert status == 400 and body["error"]["param"] == "x-request-timeout"
    assert count("OK") == ok + 1 and count("DEADLINE_EXCEEDED") == late + 1
    for _ in oai.completions.create(model=GPT, prompt="a", max_tokens=2, stream=True):
        pass
    deadline = time.monotonic() + 5
    while count("OK") < ok + 2 and time.monotonic() < deadline:  # counted after its last event is sent
        time.sleep(0.02)
    assert count("OK") == ok + 2  # a stream counts once
    text = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a b c"]}]}
    status, body = post_json(f"{server.http_url}/v2/models/{CLASSIFIER}/infer", {**text, "parameters": {"timeout": 1}})
    assert status == 504 and "deadline" in body["error"]  # Triton's timeout parameter: microseconds
    status, _ = post_json(f"{server.http_url}/v2/models/{CLASSIFIER}/infer",
                          {**text, "parameters": {"timeout": 10 ** 7}})
    assert status == 200


# ---------------------------------------------------------------- chat with a template, drain


@pytest.fixture(scope="module")
def chat_repository(tiny_checkpoints: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny GPT checkpoint with a chat template in its tokenizer_config.json, exported (the exporter copies
    the template into model.json)."""
    from tests.conftest import one_torch_thread

    from export import ExportConfig, export_checkpoint

    root = tmp_path_factory.mktemp("chat")
    checkpoint = root / "checkpoint"
    shutil.copytree(tiny_checkpoints.gpt, checkpoint)
    config_file = checkpoint / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}assistant:{% endif %}")
    config_file.write_text(json.dumps(config))
    with one_torch_thread():
        export_checkpoint(ExportConfig(checkpoint=checkpoint, task="generate", repository=root / "repo",
                                       name="chat-gpt"))
    manifest = json.loads((root / "repo" / "chat-gpt" / "1" / "model.json").read_text())
    assert manifest["chat_template"] == config["chat_template"]
    return root / "repo"


def test_chat_with_template_equals_completion_of_rendered_prompt(chat_repository: Path) -> None:
    with ServerProcess(chat_repository, ["--http-port", "0"]) as proc:
        client = openai.OpenAI(base_url=f"{proc.http_url}/v1", api_key="x", max_retries=0)
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who art thou?"}]
        rendered = "system: Be brief.\nuser: Who art thou?\nassistant:"
        chat = client.chat.completions.create(model="chat-gpt", messages=messages, max_tokens=8, temperature=0,
                                              extra_body={"ignore_eos": True})
        ref = client.completions.create(model="chat-gpt", prompt=rendered, max_tokens=8, temperature=0,
                                        extra_body={"ignore_eos": True})
        assert chat.choices[0].message.content == ref.choices[0].text
        assert chat.choices[0].message.role == "assistant" and chat.object == "chat.completion"
        assert chat.usage.prompt_tokens == ref.usage.prompt_tokens
        stream = client.chat.completions.create(model="chat-gpt", messages=messages, max_tokens=8, temperature=0,
                                                stream=True, extra_body={"ignore_eos": True})
        parts = list(stream)
        assert "".join(p.choices[0].delta.content or "" for p in parts) == ref.choices[0].text
        assert parts[-1].choices[0].finish_reason == "length"
        # logprobs: one entry per generated token, streamed as answered (each token's text came with it)
        scored = client.chat.completions.create(model="chat-gpt", messages=messages, max_tokens=8, temperature=0,
                                                logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
        entries = scored.choices[0].logprobs.content
        assert len(entries) == 8 and "".join(e.token for e in entries) == ref.choices[0].text
        assert all(len(e.top_logprobs) == 2 and e.bytes == list(e.token.encode()) for e in entries)
        streamed_entries = [e for p in client.chat.completions.create(
            model="chat-gpt", messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2,
            stream=True, extra_body={"ignore_eos": True}) for c in p.choices if c.logprobs for e in c.logprobs.content]
        assert [(e.token, e.logprob) for e in streamed_entries] == [(e.token, e.logprob) for e in entries]
        # n choices: choice j draws with seed + j, as a lone request with that seed does.
        sampled = dict(max_tokens=6, temperature=1.0, extra_body={"ignore_eos": True})
        three = client.chat.completions.create(model="chat-gpt", messages=messages, n=3, seed=5, **sampled)
        assert [c.index for c in three.choices] == [0, 1, 2]
        assert [c.message.content for c in three.choices] == [
            client.chat.completions.create(model="chat-gpt", messages=messages, seed=5 + j, **sampled)
            .choices[0].message.content for j in range(3)]
        assert three.usage.prompt_tokens == chat.usage.prompt_tokens and three.usage.completion_tokens == 18
        streamed = ["", "", ""]
        for part in client.chat.completions.create(model="chat-gpt", messages=messages, n=3, seed=5, stream=True,
                                                   **sampled):
            for c in part.choices:
                streamed[c.index] += c.delta.content or ""
        assert streamed == [c.message.content for c in three.choices]


def test_drain_finishes_open_streams_and_refuses_new_work(tiny_repository: Path, tmp_path: Path) -> None:
    """SIGTERM: admitted streams (one decoding, the rest queued: one sequence at a time) run to [DONE], a new
    request meanwhile gets 503 in OpenAI's shape (and GET /health 503), the process exits 0."""
    repo = repository_with(tiny_repository, tmp_path / "repo", GPT)
    proc = ServerProcess(repo, ["--http-port", "0", "--grace-period", "30", "--max-sequences", "1"])
    url = f"{proc.http_url}/v1/completions"
    body = {"model": GPT, "prompt": "a", "max_tokens": 120, "temperature": 0, "stream": True, "ignore_eos": True}

    async def scenario() -> tuple[list[tuple[int, list[str]]], dict[str, Any] | None, int]:
        async with httpx.AsyncClient(timeout=120) as client:
            first_event = asyncio.Event()

            async def one() -> tuple[int, list[str]]:
                async with client.stream("POST", url, json=body) as response:
                    lines = []
                    async for line in response.aiter_lines():
                        if line:
                            lines.append(line)
                            first_event.set()
                    return response.status_code, lines

            streams = [asyncio.create_task(one()) for _ in range(12)]
            await asyncio.wait_for(first_event.wait(), 60)
            proc.proc.terminate()  # SIGTERM: drain
            refused = None
            for _ in range(200):
                response = await client.post(url, json={**body, "stream": False, "max_tokens": 1})
                if response.status_code == 503:
                    refused = response.json()
                    break
                await asyncio.sleep(0.02)
            health = (await client.get(f"{proc.http_url}/health")).status_code   # draining: not ready
            return await asyncio.gather(*streams), refused, health

    try:
        results, refused, health = asyncio.run(scenario())
        assert refused is not None and "shutting down" in refused["error"]["message"] and health == 503
        assert refused["error"]["type"] == "service_unavailable"
        finished = [lines for status, lines in results if status == 200]
        assert len(finished) >= 2 and all(status in (200, 503) for status, _ in results)
        for lines in finished:
            assert lines[-1] == "data: [DONE]"
            assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "length"
        assert proc.proc.wait(60) == 0
    finally:
        proc.stop()
