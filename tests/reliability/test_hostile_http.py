"""The outside probe's hostile requests against the HTTP door and KServe text mode (docs/RELIABILITY.md, "Hostile
requests at the HTTP door"), against ONE real server process (HTTP, metrics, small generation queue), real
HTTP / gRPC clients:

1. refused or abandoned work stops: a KServe text-mode request whose prompts cannot all run starts none of them
   (REST and gRPC), and a non-streamed completion whose client disconnects is cancelled; measured with the
   server's own counters (tokens generated after the answer or the disconnect) and a bystander completion;
2. inputs of an allowed size do not freeze the server: tokenizing many long texts, a body of millions of empty
   lists, /detokenize with millions of ids, a BYTES tensor of shape [1] holding millions of empty elements
   (REST and gRPC); a bystander's health check stays under 100 ms (beyond the loaded machine's own noise);
3. 400 naming the field, never 500: integers beyond Python's 4300-digit limit, lone surrogates, a shape beyond
   int64, a lying Inference-Header-Content-Length, JSON-in-string parameters that are not JSON we can read;
5. a request that can never be admitted (more sequences than the queue plus the running batch) is 400 /
   INVALID_ARGUMENT, not a retryable 429;
8. a field that would change the answer is refused naming it (num_beams, return_token_ids, ...), a `dimensions`
   mismatch before anything is computed.
"""
from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import grpc
import httpx2 as httpx
import numpy as np
import pytest
from tests.server_process import ServerProcess, repository_with
from tritonclient.grpc import service_pb2 as kserve_pb, service_pb2_grpc as kserve_grpc

GPT, CLASSIFIER, EMBED, CHAT = "tiny-gpt", "tiny-classifier", "tiny-embed", "chat-gpt"
QUEUE, SEQUENCES = 4, 2          # --max-queued-requests, --max-sequences: no request may hold more than 6 sequences
HEALTH_BOUND_S = 0.1             # beyond the undisturbed worst; the probe saw 3 to 14 s (a check is ~2 ms when idle)
TOKENS = "ortserve_generated_tokens_total"
PREFILLED = "ortserve_prefill_tokens_total"


@pytest.fixture(scope="module")
def repository(tiny_repository: Path, tiny_checkpoints: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import one_torch_thread

    from export import ExportConfig, export_checkpoint

    root = tmp_path_factory.mktemp("hostile")
    repo = repository_with(tiny_repository, root / "repo", GPT, CLASSIFIER)
    chat = root / "chat-checkpoint"             # the tiny GPT with a chat template
    shutil.copytree(tiny_checkpoints.gpt, chat)
    config = json.loads((chat / "tokenizer_config.json").read_text())
    config["chat_template"] = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}assistant:{% endif %}")
    (chat / "tokenizer_config.json").write_text(json.dumps(config))
    with one_torch_thread():
        export_checkpoint(ExportConfig(checkpoint=tiny_checkpoints.mlm, task="embed", repository=repo, name=EMBED,
                                       pooling="cls", normalize="off"))
        export_checkpoint(ExportConfig(checkpoint=chat, task="generate", repository=repo, name=CHAT))
    return repo


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    args = ["--http-port", "0", "--metrics-port", "0", "--max-queued-requests", str(QUEUE), "--max-sequences",
            str(SEQUENCES), "--max-message-bytes", str(80 * 2 ** 20)]
    with ServerProcess(repository, args) as proc:
        yield proc


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.http_url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def kserve(server: ServerProcess) -> Iterator[kserve_grpc.GRPCInferenceServiceStub]:
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(server.address, options=options) as channel:
        yield kserve_grpc.GRPCInferenceServiceStub(channel)


class HealthBystander:
    """GET /v2/health/ready in a loop on its own connection while a test misbehaves, each call timed. The first
    half second is the baseline: the bound is HEALTH_BOUND_S beyond the worst check of an undisturbed server on
    the same (shared, loaded) cores, so that scheduling noise is not counted as a freeze."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.latency: list[float] = []
        self.baseline: list[float] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    if client.get(f"{self.url}/v2/health/ready").status_code != 200:
                        self.errors.append("not ready")
                except httpx.HTTPError as exc:
                    self.errors.append(repr(exc))
                self.latency.append(time.perf_counter() - started)
                time.sleep(0.005)

    def __enter__(self) -> "HealthBystander":
        self._thread.start()
        time.sleep(0.5)
        self.baseline, self.latency = self.latency, []
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def check(self) -> float:
        assert not self.errors, self.errors[:3]
        worst, noise = max(self.latency, default=0.0), max(self.baseline)
        assert worst < HEALTH_BOUND_S + noise, \
            f"a health check took {worst * 1000:.0f} ms ({len(self.latency)} checks; undisturbed: {noise * 1000:.0f} ms)"
        return worst


def hostile(server: ServerProcess, call: Callable[[], Any]) -> tuple[Any, float, float]:
    """(call's result, its duration, the bystander's worst health check) with the bystander checked."""
    with HealthBystander(server.http_url) as bystander:
        started = time.perf_counter()
        result = call()
        took = time.perf_counter() - started
    return result, took, bystander.check()


def error_of(response: httpx.Response) -> str:
    error = response.json()["error"]
    return error["message"] if isinstance(error, dict) else error


def settled(server: ServerProcess, name: str, quiet: float = 0.5, timeout: float = 30.0) -> float:
    """The metric's value once it stopped changing for `quiet` seconds."""
    end = time.monotonic() + timeout
    value = server.metric(name, model=GPT)
    while time.monotonic() < end:
        time.sleep(quiet)
        now = server.metric(name, model=GPT)
        if now == value:
            return now
        value = now
    raise AssertionError(f"{name} still changing after {timeout} s")


def text_infer(prompts: list[str], max_new_tokens: int) -> dict[str, Any]:
    return {"inputs": [{"name": "prompt", "datatype": "BYTES", "shape": [len(prompts)], "data": prompts}],
            "parameters": {"max_new_tokens": max_new_tokens, "ignore_eos": True}}


def grpc_text_infer(prompts: list[str], max_new_tokens: int) -> kserve_pb.ModelInferRequest:
    request = kserve_pb.ModelInferRequest(model_name=GPT)
    request.inputs.add(name="prompt", datatype="BYTES", shape=[len(prompts)]).contents.bytes_contents.extend(
        p.encode() for p in prompts)
    request.parameters["max_new_tokens"].int64_param = max_new_tokens
    request.parameters["ignore_eos"].bool_param = True
    return request


# ---------------------------------------------------------------------------- 1. refused or abandoned work stops


def test_a_text_mode_request_whose_prompts_cannot_all_run_starts_none(
        server: ServerProcess, http: httpx.Client, kserve: kserve_grpc.GRPCInferenceServiceStub) -> None:
    """Before: each prompt was admitted on its own; when one was refused (a prompt too long, the queue full) the
    others went on generating for nobody (the probe: ~30,000 tokens, a neighbour's completion took 9 s)."""
    too_long = "the king " * 2000                   # more characters than tiny-gpt's context can hold
    good = ["To be, or not", "Now is the winter", "Friends, Romans", "All the world"]
    before = settled(server, TOKENS), server.metric(PREFILLED, model=GPT)

    rest = http.post(f"/v2/models/{GPT}/infer", json=text_infer([*good, too_long], 100))
    assert rest.status_code == 400 and error_of(rest).startswith("prompt: "), rest.text
    with pytest.raises(grpc.RpcError) as refused:
        kserve.ModelInfer(grpc_text_infer([*good, too_long], 100), timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert settled(server, TOKENS) == before[0] and server.metric(PREFILLED, model=GPT) == before[1]

    # Six sequences fit the queue (4) and the running batch (2) together: all are served.
    six = [f"{p} {i}" for i, p in enumerate(good + good[:2])]
    ok = http.post(f"/v2/models/{GPT}/infer", json=text_infer(six, 20))
    assert ok.status_code == 200, ok.text
    assert len(ok.json()["outputs"][0]["data"]) == 6
    assert settled(server, TOKENS) == before[0] + 6 * 20


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_completion_whose_client_disconnects_is_cancelled(server: ServerProcess, http: httpx.Client,
                                                            path: str) -> None:
    """Before: a non-streamed /v1/completions (or chat) went on generating after its client left (the probe:
    ~59,000 tokens, a neighbour waited 17.5 s). Now the route is cancelled with the connection: at most the
    steps computing when it left finish. The client leaves as soon as the first tokens are counted."""
    if path == "/v1/completions":   # 4 sequences x 100 tokens, 2 at a time (~0.2 s on 2 idle cores)
        body = {"model": GPT, "prompt": ["Now is the winter", "To be, or not"], "n": 2}
    else:
        body = {"model": CHAT, "messages": [{"role": "user", "content": "Who art thou?"}], "n": 4}
    payload = json.dumps({**body, "max_tokens": 100, "ignore_eos": True, "seed": 1}).encode()
    def generated() -> float:
        return server.metric(TOKENS, model=GPT) + server.metric(TOKENS, model=CHAT)

    settled(server, TOKENS)
    before = generated()
    with socket.create_connection((server.host, server.http_port)) as raw:   # a client that leaves once it runs
        raw.sendall(b"POST %s HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: %d"
                    b"\r\n\r\n%s" % (path.encode(), len(payload), payload))
        end = time.monotonic() + 10
        while generated() == before and time.monotonic() < end:
            time.sleep(0.002)
    left = generated()
    started = time.perf_counter()
    neighbour = http.post("/v1/completions", json={"model": GPT, "prompt": "Friends", "max_tokens": 8,
                                                   "ignore_eos": True})
    waited = time.perf_counter() - started
    assert neighbour.status_code == 200, neighbour.text
    settled(server, TOKENS)
    after = generated()
    orphans = after - left - 8                   # generated after the client left (the neighbour's 8 aside)
    assert left > before, "the request never started generating"
    assert orphans <= 4 * SEQUENCES, f"{orphans:.0f} tokens generated after the client left ({left - before:.0f} before)"
    assert server.metric("ortserve_active_sequences", model=GPT) == 0
    assert server.metric("ortserve_active_sequences", model=CHAT) == 0
    print(f"\n{path} disconnect: {left - before:.0f} of 400 tokens generated before the client left, {orphans:.0f} "
          f"after; neighbour 8 tokens in {waited * 1000:.0f} ms")


# ---------------------------------------------------------------------------- 2. allowed sizes do not freeze it


def test_many_long_texts_are_tokenized_off_the_event_loop(server: ServerProcess, http: httpx.Client) -> None:
    """256 texts each just under the per-text character bound (128 tokens x 100 characters): tokenized in a
    worker thread (the probe: 1024 of them froze everything for 8.5 s via embeddings, 13 s via classify)."""
    texts = ["ab " * 4266] * 256
    embed, took, worst = hostile(server, lambda: http.post("/v1/embeddings", json={"model": EMBED, "input": texts}))
    assert embed.status_code == 400 and "exceed the model's max_length" in error_of(embed)
    classify, took2, worst2 = hostile(server, lambda: http.post(
        f"/v2/models/{CLASSIFIER}/infer",
        json={"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}))
    assert classify.status_code == 400 and "exceed the model's max_length" in error_of(classify)
    print(f"\nlong texts: embeddings {took:.2f} s (health max {worst * 1000:.0f} ms), "
          f"classify {took2:.2f} s (health max {worst2 * 1000:.0f} ms)")


def test_a_body_of_millions_of_tiny_values_is_refused_while_it_arrives(server: ServerProcess,
                                                                       http: httpx.Client) -> None:
    """57 MB of empty lists in a field the route ignores (the probe: 7 s frozen, +1.3 GB, then 200), and
    /detokenize with 10 million ids (3 s frozen): refused from the values' count, before any parsing."""
    junk = b"[]," * 19_000_000
    kserve_body = b'{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"data":["hi"]}],"junk":[' + junk + b"[]]}"
    openai_body = b'{"model":"' + GPT.encode() + b'","prompt":"hi","max_tokens":2,"junk":[' + junk + b"[]]}"
    ids = b'{"model":"' + GPT.encode() + b'","tokens":[' + b"5," * 10_000_000 + b"5]}"
    json_type = {"content-type": "application/json"}
    for path, content in ((f"/v2/models/{CLASSIFIER}/infer", kserve_body), ("/v1/completions", openai_body),
                          ("/detokenize", ids)):
        answer, took, worst = hostile(server, lambda: http.post(path, content=content, headers=json_type))
        assert answer.status_code == 400 and error_of(answer).startswith("body: more than 1048576 JSON values"), \
            answer.text[:300]
        print(f"\n{path}: {len(content) / 1e6:.0f} MB refused in {took:.2f} s, health max {worst * 1000:.0f} ms")
    # Within the values bound, /detokenize is bounded by the model's context.
    answer = http.post("/detokenize", json={"model": GPT, "tokens": [5] * 1000})
    assert answer.status_code == 400 and error_of(answer).startswith("tokens: 1000 ids exceed the model's context")


def test_a_bytes_tensor_of_millions_of_empty_elements_is_refused_at_once(
        server: ServerProcess, http: httpx.Client, kserve: kserve_grpc.GRPCInferenceServiceStub) -> None:
    """A BYTES tensor of shape [1] whose raw contents hold millions of zero-length elements (the probe: 15
    million, 8 s frozen, REST and gRPC, then refused): decoding stops at the element after the shape's count.
    2 million here (8 MB): copying the probe's 60 MB message alone takes the gRPC transport (grpcio's
    deserializer, then the bytes of the field) ~150 ms on 2 loaded cores, whatever it holds (docs/RELIABILITY.md),
    and 16 MB once took 102 ms of a health check's 101 ms bound in a full suite run (2026-11-27)."""
    raw = b"\0\0\0\0" * 2_000_000
    header = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                     "parameters": {"binary_data_size": len(raw)}}]}).encode()
    rest, took, worst = hostile(server, lambda: http.post(
        f"/v2/models/{CLASSIFIER}/infer", content=header + raw,
        headers={"Inference-Header-Content-Length": str(len(header))}))
    assert rest.status_code == 400 and "more BYTES elements than its shape's 1" in error_of(rest), rest.text

    request = kserve_pb.ModelInferRequest(model_name=CLASSIFIER, raw_input_contents=[raw])
    request.inputs.add(name="text", datatype="BYTES", shape=[1])

    def call() -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as info:
            kserve.ModelInfer(request, timeout=60)
        return info.value
    error, took2, worst2 = hostile(server, call)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "more BYTES elements" in error.details()
    # A shape of millions of BYTES elements is refused from the shape, before any is decoded.
    request.inputs[0].shape[:] = [4_000_000]
    with pytest.raises(grpc.RpcError) as counted:
        kserve.ModelInfer(request, timeout=60)
    assert counted.value.details().startswith("inputs[0].shape: 4000000 BYTES elements exceed max_rows_per_request")
    print(f"\nBYTES [1] x 2M: REST {took:.2f} s (health max {worst * 1000:.0f} ms), gRPC {took2:.2f} s "
          f"(health max {worst2 * 1000:.0f} ms)")


# ---------------------------------------------------------------------------- 3. 400 naming the field, never 500

BIG = "1" * 5000      # beyond Python's 4300-digit limit for int()
TEXT_MODE = '{"inputs":[{"name":"prompt","datatype":"BYTES","shape":[1],"data":["hi"]}],"parameters":{%s}}'
REFUSED_NAMING = [
    ("/v1/completions", '{"model":"tiny-gpt","prompt":"hi","max_tokens":%s}' % BIG, "max_tokens"),
    ("/v1/completions", '{"model":"tiny-gpt","prompt":[1,%s]}' % BIG, "prompt[1]"),
    ("/v1/chat/completions", '{"model":"tiny-gpt","messages":[{"role":"user","content":"hi"}],"seed":%s}' % BIG,
     "seed"),
    ("/v1/embeddings", '{"model":"tiny-embed","input":"hi","dimensions":-%s}' % BIG, "dimensions"),
    ("/detokenize", '{"model":"tiny-gpt","tokens":[%s]}' % BIG, "tokens[0]"),
    (f"/v2/models/{CLASSIFIER}/infer",
     '{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"data":["hi"]}],"extra":[%s]}' % BIG, "extra[0]"),
    ("/v2/repository/index", '{"ready":%s}' % BIG, "ready"),
    (f"/v2/models/{CLASSIFIER}/infer",
     '{"inputs":[{"name":"input_ids","datatype":"INT64","shape":[0,%d],"data":[]}]}' % 2 ** 63, "inputs[0].shape"),
    ("/v1/completions", '{"model":"tiny-gpt","prompt":"\\ud800"}', "prompt"),
    ("/v1/completions", '{"model":"tiny-gpt","prompt":"hi","stop":["ok","\\udfff"]}', "stop[1]"),
    ("/v1/chat/completions", '{"model":"tiny-gpt","messages":[{"role":"user","content":"a\\ud800b"}]}',
     "messages[0].content"),
    ("/v1/embeddings", '{"model":"tiny-embed","input":["fine","\\ud83d"]}', "input[1]"),
    ("/tokenize", '{"model":"tiny-gpt","prompt":"\\ud800"}', "prompt"),
    ("/tokenize", '{"model":"tiny-embed","prompt":"a\\udfff"}', "prompt"),
    ("/detokenize", '{"model":"tiny-embed","tokens":[2,%s]}' % BIG, "tokens[1]"),
    ("/v1/rerank", '{"model":"tiny-embed","query":"hi","documents":["a"],"top_n":%s}' % BIG, "top_n"),
    ("/v1/rerank", '{"model":"tiny-embed","query":"hi","documents":["a","\\ud800"]}', "documents[1]"),
    ("/v1/rerank", '{"model":"tiny-embed","query":"\\ud800","documents":["a"]}', "query"),
    ("/v1/rerank", '{"model":"tiny-embed","query":"hi","documents":[%s]}' % ",".join(['""'] * 150_000), "documents"),
    ("/v1/score", '{"model":"tiny-embed","text_1":"hi","text_2":["a",%s]}' % BIG, "text_2[1]"),
    ("/rerank", '{"model":"tiny-embed","query":"hi","texts":["a"],"raw_scores":%s}' % BIG, "raw_scores"),
    ("/rerank", '{"model":"tiny-embed","query":"hi","texts":[%s]}' % ",".join(['"a"'] * 150_000), "texts"),
    (f"/v2/models/{CLASSIFIER}/infer",
     '{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"data":["\\ud800"]}]}', "inputs[0].data[0]"),
    (f"/v2/models/{GPT}/infer", TEXT_MODE % ('"stop":"[%s]"' % BIG), "parameters.stop[0]"),
    (f"/v2/models/{GPT}/infer", TEXT_MODE % ('"logit_bias":"{\\"5\\": %s}"' % BIG), "parameters.logit_bias.5"),
    (f"/v2/models/{GPT}/infer", TEXT_MODE % ('"stop":"%s"' % ("[" * 100_000)), "parameters.stop"),
    (f"/v2/models/{GPT}/infer", TEXT_MODE % '"stop":"[\\"\\\\ud800\\"]"', "parameters.stop[0]"),
]


@pytest.mark.parametrize("path,body,field", REFUSED_NAMING, ids=[f"{p} {f}" for p, _, f in REFUSED_NAMING])
def test_what_cannot_be_read_is_400_naming_the_field(http: httpx.Client, path: str, body: str, field: str) -> None:
    answer = http.post(path, content=body.encode(), headers={"content-type": "application/json"})
    assert answer.status_code == 400, answer.text[:300]
    assert error_of(answer).startswith(f"{field}: "), error_of(answer)


def test_lying_headers_are_400(server: ServerProcess, http: httpx.Client) -> None:
    body = b'{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"data":["hi"]}]}'
    for length in ("\u00b2".encode(), b"-1", b"1e3", str(len(body) + 1).encode(), b"\xd9\xa3"):
        answer = http.post(f"/v2/models/{CLASSIFIER}/infer", content=body,
                           headers={"Inference-Header-Content-Length": length})
        assert answer.status_code == 400 and error_of(answer).startswith("inference-header-content-length: "), \
            (length, answer.text)
    assert "Traceback" not in "".join(server.lines)


# ---------------------------------------------------------------------------- 5. never admitted: 400, not 429


def test_a_request_that_can_never_be_admitted_is_invalid_not_429(
        server: ServerProcess, http: httpx.Client, kserve: kserve_grpc.GRPCInferenceServiceStub) -> None:
    """More sequences than the queue (4) plus the running batch (2): the probe's 5,000 prompts, or 300 prompts x
    n 16, were told "queue full (256 waiting)", a retryable 429."""
    before = settled(server, TOKENS)
    answer = http.post("/v1/completions", json={"model": GPT, "prompt": ["a", "b", "c", "d"], "n": 2,
                                                "max_tokens": 50, "ignore_eos": True})
    assert answer.status_code == 400, answer.text
    assert error_of(answer).startswith("prompt: 8 sequences in one request exceed the 6"), error_of(answer)
    streamed = http.post("/v1/completions", json={"model": GPT, "prompt": ["a"] * 7, "stream": True})
    assert streamed.status_code == 400 and error_of(streamed).startswith("prompt: 7 sequences")
    rest = http.post(f"/v2/models/{GPT}/infer", json=text_infer(["a"] * 7, 50))
    assert rest.status_code == 400 and error_of(rest).startswith("inputs['prompt']: 7 sequences"), rest.text
    with pytest.raises(grpc.RpcError) as refused:
        kserve.ModelInfer(grpc_text_infer(["a"] * 7, 50), timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith("inputs['prompt']: 7 sequences in one request exceed the 6")
    assert settled(server, TOKENS) == before        # nothing of them ran


# ---------------------------------------------------------------------------- 8. never silently ignored


@pytest.mark.parametrize("path,extra,field", [
    ("/v1/completions", {"return_token_ids": True}, "return_token_ids"),
    ("/v1/completions", {"allowed_token_ids": [1, 2]}, "allowed_token_ids"),
    ("/v1/completions", {"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
    ("/v1/chat/completions", {"functions": [{"name": "f"}]}, "functions"),
    ("/v1/embeddings", {"truncate_prompt_tokens": 8}, "truncate_prompt_tokens"),
    ("/v1/completions", {"stream": True, "stream_options": {"continuous_usage_stats": True}},
     "stream_options.continuous_usage_stats"),
    ("/v1/chat/completions", {"messages": [{"role": "assistant", "content": None, "function_call": {"name": "f"}},
                                           {"role": "user", "content": "hi"}]}, "messages[0].function_call"),
])
def test_a_field_that_would_change_the_answer_is_refused_naming_it(http: httpx.Client, path: str,
                                                                   extra: dict[str, Any], field: str) -> None:
    base: dict[str, Any] = {"model": GPT, "prompt": "hi", "max_tokens": 2}
    if path.endswith("chat/completions"):
        base = {"model": GPT, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    elif path.endswith("embeddings"):
        base = {"model": EMBED, "input": "hi"}
    answer = http.post(path, json={**base, **extra})
    assert answer.status_code == 400, answer.text
    assert error_of(answer).startswith(f"{field}: is not supported"), error_of(answer)
    assert answer.json()["error"]["param"] == field


@pytest.mark.parametrize("path,extra,message", [
    ("/v1/completions", {"use_beam_search": True}, "best_of: use_beam_search needs at least 2 beams"),
    ("/v1/completions", {"num_beams": True}, "num_beams: must be"),
    ("/v1/completions", {"num_beams": 9}, "num_beams: must be in [1, 8]"),
])
def test_beams_asked_wrongly_are_refused_naming_the_field(http: httpx.Client, path: str, extra: dict[str, Any],
                                                          message: str) -> None:
    """Beam search is served on decoders too (tests/e2e/grpc/test_decoder_beam_search.py); asked without beams to
    search (vLLM's use_beam_search with one), or with a number that is not one, it is refused by name."""
    answer = http.post(path, json={"model": GPT, "prompt": "hi", "max_tokens": 2, "temperature": 0, **extra})
    assert answer.status_code == 400, answer.text
    assert error_of(answer).startswith(message), error_of(answer)


def test_neutral_values_of_unsupported_fields_are_accepted(http: httpx.Client) -> None:
    """What clients send as defaults (beam search off, one beam, plain text) changes nothing: served."""
    answer = http.post("/v1/completions", json={
        "model": GPT, "prompt": "hi", "max_tokens": 2, "num_beams": 1, "use_beam_search": False,
        "return_token_ids": False, "skip_special_tokens": True, "response_format": {"type": "text"},
        "user": "someone", "suffix": ""})
    assert answer.status_code == 200, answer.text


def test_a_dimensions_mismatch_is_refused_before_computing(http: httpx.Client,
                                                           kserve: kserve_grpc.GRPCInferenceServiceStub) -> None:
    def rows() -> int:
        stats = kserve.ModelStatistics(kserve_pb.ModelStatisticsRequest(name=EMBED), timeout=10)
        return sum(s.inference_count for s in stats.model_stats)

    before = rows()
    answer = http.post("/v1/embeddings", json={"model": EMBED, "input": ["a", "b", "c"], "dimensions": 5})
    assert answer.status_code == 400 and error_of(answer).startswith("dimensions: 'tiny-embed' answers 64-dimensional")
    assert rows() == before
    served = http.post("/v1/embeddings", json={"model": EMBED, "input": ["a"], "dimensions": 64})
    assert served.status_code == 200 and np.asarray(served.json()["data"][0]["embedding"]).shape == (64,)
