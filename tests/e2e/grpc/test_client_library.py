"""Client library (sync + asyncio) against real server processes on localhost.

Expected values come from the model packages themselves (onnxruntime + tokenizers run here, in the
test), from how the tiny models were built (keyword-trained classifier), or from the proto contract.
"""
from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from clients import AsyncOrtserveClient, Backoff, OrtserveClient, OrtserveError, TLSConfig
from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc
from tests.server_process import ServerProcess, free_port, repository_with, shared_server

LABELS = ["alpha", "beta", "gamma"]  # tiny-classifier, trained on keyword groups (tests/conftest.py)
KEYWORD_TEXTS = {
    "alpha": "The old boat left the harbour with the tide",
    "beta": "The king drew his sword before the castle",
    "gamma": "A rose and a tree in the quiet garden",
}


@pytest.fixture(scope="module")
def server(tiny_repository: Path) -> ServerProcess:
    return shared_server(tiny_repository)


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> OrtserveClient:
    with OrtserveClient(server.address, timeout=30) as c:
        yield c


class Package:
    """A model package run directly with onnxruntime: the reference the server must agree with."""

    def __init__(self, path: Path, variant: str) -> None:
        manifest = json.loads((path / "model.json").read_text())
        self.session = ort.InferenceSession(str(path / manifest["variants"][variant]),
                                            providers=["CPUExecutionProvider"])
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))

    def logits(self, text: str, pair: str | None = None) -> tuple[list[int], np.ndarray]:
        enc = self.tokenizer.encode(text, pair) if pair is not None else self.tokenizer.encode(text)
        ids = np.array([enc.ids], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                 "token_type_ids": np.array([enc.type_ids], dtype=np.int64)}
        return enc.ids, self.session.run(["logits"], feeds)[0][0]


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max())
    return e / e.sum()


def test_classify_agrees_with_the_package_run_directly(client: OrtserveClient, tiny_repository: Path) -> None:
    info = client.model_info("tiny-classifier")
    package = Package(tiny_repository / "tiny-classifier" / "1", info.variant)
    inputs = [KEYWORD_TEXTS["alpha"], KEYWORD_TEXTS["beta"], (KEYWORD_TEXTS["gamma"], "and a river boat")]
    results = client.classify(inputs, "tiny-classifier")
    assert [r.label for r in results[:2]] == ["alpha", "beta"]
    for item, result in zip(inputs, results):
        text, pair = item if isinstance(item, tuple) else (item, None)
        probs = softmax(package.logits(text, pair)[1])
        assert result.label == LABELS[int(np.argmax(probs))]
        assert {s.label: s.score for s in result.scores} == pytest.approx(dict(zip(LABELS, probs)), abs=1e-4)
        assert [s.score for s in result.scores] == sorted((s.score for s in result.scores), reverse=True)
    top1 = client.classify(KEYWORD_TEXTS["gamma"], "tiny-classifier", top_k=1)
    assert len(top1) == 1 and top1[0].label == "gamma" and [s.label for s in top1[0].scores] == ["gamma"]


def test_fill_mask_agrees_with_the_package_run_directly(client: OrtserveClient, tiny_repository: Path) -> None:
    package = Package(tiny_repository / "tiny-fill-mask" / "1", "fp32")
    text = "the [MASK] sat on a [MASK]"
    [result] = client.fill_mask([text], "tiny-fill-mask", top_k=3)
    ids, logits = package.logits(text)
    mask_id = package.tokenizer.token_to_id("[MASK]")
    assert [m.position for m in result.masks] == [i for i, t in enumerate(ids) if t == mask_id]
    for mask in result.masks:
        probs = softmax(logits[mask.position])
        expected = np.argsort(-probs, kind="stable")[:3]
        assert [c.token_id for c in mask.candidates] == expected.tolist()
        assert [c.score for c in mask.candidates] == pytest.approx(probs[expected].tolist(), abs=1e-5)
        assert all(c.sequence.count("[MASK]") == 1 for c in mask.candidates)  # the other mask stays


def test_generate_and_stream_agree(client: OrtserveClient, tiny_repository: Path) -> None:
    prompt = "To be, or not to be"
    tokenizer = Tokenizer.from_file(str(tiny_repository / "tiny-gpt" / "1" / "tokenizer.json"))
    full = client.generate(prompt, "tiny-gpt", max_new_tokens=12, ignore_eos=True)
    assert full.finish_reason == "length"
    assert full.usage.prompt_tokens == len(tokenizer.encode(prompt).ids)
    assert full.usage.completion_tokens == len(full.tokens) == 12
    assert full.model == "tiny-gpt" and full.version == 1
    chunks = list(client.generate_stream(prompt, "tiny-gpt", max_new_tokens=12, ignore_eos=True))
    assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert "".join(c.text for c in chunks) == full.text
    assert [t.token_id for c in chunks for t in c.tokens] == [t.token_id for t in full.tokens]
    assert chunks[-1].finish_reason == "length" and chunks[-1].usage == full.usage
    # Asking for logprobs fills them (and only then).
    with_lp = client.generate(prompt, "tiny-gpt", max_new_tokens=3, ignore_eos=True, top_logprobs=2)
    assert all(t.logprob is not None and t.logprob <= 0 and len(t.top_logprobs) == 2 for t in with_lp.tokens)
    assert all(t.logprob is None for t in full.tokens)


def test_penalties_and_logit_bias_cross_the_task_api(client: OrtserveClient) -> None:
    """The proto's presence / frequency penalties and logit_bias map reach the sampler (the random model repeats
    its last token greedily; its logits lie within 2 of each other)."""
    plain = [t.token_id for t in client.generate("To be", "tiny-gpt", max_new_tokens=6, ignore_eos=True).tokens]
    assert len(set(plain)) < 6, plain
    for penalty in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}):
        ids = [t.token_id for t in client.generate("To be", "tiny-gpt", max_new_tokens=6, ignore_eos=True,
                                                   **penalty).tokens]
        assert ids[0] == plain[0] and len(set(ids)) == 6, (penalty, ids)
    forced = client.generate("To be", "tiny-gpt", max_new_tokens=4, ignore_eos=True, logit_bias={300: 100.0})
    assert [t.token_id for t in forced.tokens] == [300] * 4
    with pytest.raises(OrtserveError) as err:
        client.generate("To be", "tiny-gpt", logit_bias={300: 101.0})
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.message.startswith(
        "parameters.logit_bias[300]:")


def test_a_token_id_prompt_answers_as_its_text(client: OrtserveClient, server: ServerProcess,
                                               tiny_repository: Path) -> None:
    tokenizer = Tokenizer.from_file(str(tiny_repository / "tiny-gpt" / "1" / "tokenizer.json"))
    text = "To be, or not to be"
    ids = tokenizer.encode(text).ids
    by_text = client.generate(text, "tiny-gpt", max_new_tokens=6, ignore_eos=True)
    by_ids = client.generate(ids, "tiny-gpt", max_new_tokens=6, ignore_eos=True)
    assert by_ids.text == by_text.text and by_ids.usage == by_text.usage
    streamed = list(client.generate_stream(ids, "tiny-gpt", max_new_tokens=6, ignore_eos=True))
    assert "".join(c.text for c in streamed) == by_text.text
    with pytest.raises(OrtserveError) as err:
        client.generate([1, 10 ** 9], "tiny-gpt")
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.message.startswith("prompt[1]:")
    with grpc.insecure_channel(server.address) as channel:   # the proto allows both; the server refuses that
        with pytest.raises(grpc.RpcError) as both:
            pb_grpc.TaskServiceStub(channel).Generate(pb.GenerateRequest(model="tiny-gpt", prompt="a", prompt_ids=[1]))
    assert both.value.code() == grpc.StatusCode.INVALID_ARGUMENT and both.value.details().startswith("prompt_ids:")


def test_leaving_a_stream_early_cancels_it(client: OrtserveClient) -> None:
    stream = client.generate_stream("Once", "tiny-gpt", max_new_tokens=100, ignore_eos=True)
    first = next(stream)
    stream.close()
    assert not first.final
    # The server is still fine (the cancelled sequence freed its slot).
    assert client.generate("Once", "tiny-gpt", max_new_tokens=2).usage.completion_tokens <= 2


def test_a_stream_started_on_one_thread_finishes_on_another(client: OrtserveClient) -> None:
    """The sync client reads a stream's messages on the thread that iterates it (clients/channel.py): a stream
    half-read on one thread and finished on another gives the unary answer's tokens (docs/clients.md)."""
    whole = client.generate("Once", "tiny-gpt", max_new_tokens=24, ignore_eos=True)
    stream = client.generate_stream("Once", "tiny-gpt", max_new_tokens=24, ignore_eos=True, stream_interval=4)
    chunks = [next(stream)]
    worker = threading.Thread(target=lambda: chunks.extend(stream))
    worker.start()
    worker.join(60)
    assert not worker.is_alive() and len(chunks) > 2 and chunks[-1].final
    assert [t.token_id for c in chunks for t in c.tokens] == [t.token_id for t in whole.tokens]


def test_async_client_gives_the_same_answers(client: OrtserveClient, server: ServerProcess) -> None:
    async def ask() -> tuple:
        async with AsyncOrtserveClient(server.address, timeout=30) as aclient:
            classified, generated, models, health = await asyncio.gather(
                aclient.classify([KEYWORD_TEXTS["beta"]], "tiny-classifier"),
                aclient.generate("Hello", "tiny-gpt", max_new_tokens=6, ignore_eos=True),
                aclient.list_models(), aclient.health("tiny-gpt"))
            chunks = [c async for c in aclient.generate_stream("Hello", "tiny-gpt", max_new_tokens=6,
                                                                ignore_eos=True)]
            with pytest.raises(OrtserveError) as err:
                await aclient.fill_mask(["no mask here"], "tiny-fill-mask")
            return classified, generated, models, health, chunks, err.value

    classified, generated, models, health, chunks, error = asyncio.run(ask())
    assert classified[0].label == client.classify([KEYWORD_TEXTS["beta"]], "tiny-classifier")[0].label == "beta"
    assert generated.text == client.generate("Hello", "tiny-gpt", max_new_tokens=6, ignore_eos=True).text
    assert "".join(c.text for c in chunks) == generated.text and chunks[-1].final
    assert models == client.list_models()
    assert health == "SERVING"
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT and "texts[0]" in error.message


def test_models_info_and_health(client: OrtserveClient) -> None:
    statuses = {m.name: m for m in client.list_models()}
    assert {n: (m.task, m.state, m.version) for n, m in statuses.items()} == {
        "tiny-classifier": ("classify", "SERVING", 1), "tiny-fill-mask": ("fill-mask", "SERVING", 1),
        "tiny-gpt": ("generate", "SERVING", 1)}
    info = client.model_info("tiny-classifier")
    assert info.labels == LABELS and info.versions == [1] and info.manifest["name"] == "tiny-classifier"
    assert info.variant in info.manifest["variants"]
    assert client.model_info("tiny-fill-mask").mask_token == "[MASK]"
    assert client.health() == "SERVING" and client.health("tiny-gpt") == "SERVING"
    with pytest.raises(OrtserveError) as err:
        client.health("no-such-model")
    assert err.value.code == grpc.StatusCode.NOT_FOUND


def test_errors_carry_the_code_and_are_not_retried(server: ServerProcess) -> None:
    # A long backoff: any retry would show in the elapsed time.
    with OrtserveClient(server.address, retries=5, backoff=Backoff(initial=2.0)) as slow_retrier:
        cases = [
            (lambda: slow_retrier.classify("x", "no-such-model"), grpc.StatusCode.NOT_FOUND, "no-such-model"),
            (lambda: slow_retrier.generate("x", "tiny-gpt", top_p=2.0), grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
            (lambda: slow_retrier.fill_mask("no mask", "tiny-fill-mask"), grpc.StatusCode.INVALID_ARGUMENT,
             "texts[0]"),
            (lambda: slow_retrier.classify("x", "tiny-gpt"), grpc.StatusCode.INVALID_ARGUMENT, "model"),
        ]
        for call, code, field in cases:
            start = time.monotonic()
            with pytest.raises(OrtserveError) as err:
                call()
            assert err.value.code == code, err.value
            assert field in err.value.message
            assert time.monotonic() - start < 1.5
        with pytest.raises(TypeError, match="unknown generation parameter"):
            slow_retrier.generate("x", "tiny-gpt", max_tokens=3)


def test_deadline_exceeded(server: ServerProcess) -> None:
    with OrtserveClient(server.address) as c:
        # The server passes the deadline on to generation, which ends a running sequence at the
        # deadline with finish_reason "cancelled" (keeping its text), so that answer may win the
        # race against the client's own timer; both are a call cut short by its deadline.
        try:
            cut = c.generate("x", "tiny-gpt", max_new_tokens=100, ignore_eos=True, timeout=0.005)
        except OrtserveError as e:
            assert e.code == grpc.StatusCode.DEADLINE_EXCEEDED
        else:
            assert cut.finish_reason == "cancelled" and cut.usage.completion_tokens < 100
    # A peer that accepts TCP but never speaks gRPC: the deadline bounds the call, retries included.
    with socket.socket() as black_hole:
        black_hole.bind(("127.0.0.1", 0))
        black_hole.listen(8)
        with OrtserveClient(f"127.0.0.1:{black_hole.getsockname()[1]}", timeout=0.5, retries=3) as c:
            start = time.monotonic()
            with pytest.raises(OrtserveError) as err:
                c.list_models()
            assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
            assert 0.4 < time.monotonic() - start < 3.0


def test_unavailable_without_retries_fails_fast() -> None:
    with OrtserveClient(f"127.0.0.1:{free_port()}", retries=0) as c:
        start = time.monotonic()
        with pytest.raises(OrtserveError) as err:
            c.list_models()
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - start < 2.0


def test_calls_retry_until_a_late_server_starts(tiny_repository: Path, tmp_path: Path) -> None:
    """A unary call and a stream begin before the server exists; both succeed once it is up."""
    repo = repository_with(tiny_repository, tmp_path / "repo", "tiny-classifier", "tiny-gpt")
    port = free_port()
    started: list[ServerProcess] = []
    delay = 1.0

    def start_late() -> None:
        time.sleep(delay)
        started.append(ServerProcess(repo, port=port))

    starter = threading.Thread(target=start_late)
    begin = time.monotonic()
    starter.start()
    try:
        with OrtserveClient(f"127.0.0.1:{port}", timeout=60, retries=200,
                            backoff=Backoff(initial=0.05, maximum=0.3)) as c, ThreadPoolExecutor(2) as pool:
            unary = pool.submit(c.classify, KEYWORD_TEXTS["alpha"], "tiny-classifier")
            stream = pool.submit(lambda: list(c.generate_stream("Hi", "tiny-gpt", max_new_tokens=4,
                                                                ignore_eos=True)))
            assert unary.result()[0].label == "alpha"
            chunks = stream.result()
        assert chunks[-1].final and chunks[-1].usage.completion_tokens == 4
        assert time.monotonic() - begin >= delay  # they really waited for the server
    finally:
        starter.join()
        for s in started:
            s.stop()


def _self_signed_cert(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


def test_tls_and_bearer_token(tiny_repository: Path, tmp_path: Path) -> None:
    cert, key = _self_signed_cert(tmp_path)
    repo = repository_with(tiny_repository, tmp_path / "repo", "tiny-classifier")
    with ServerProcess(repo, ["--tls-cert", str(cert), "--tls-key", str(key), "--auth-token", "s3cret"],
                       root_cert=cert) as s:
        tls = TLSConfig(root_cert=cert)
        with OrtserveClient(s.address, tls=tls, token="s3cret", timeout=10) as c:
            assert c.classify(KEYWORD_TEXTS["beta"], "tiny-classifier")[0].label == "beta"
        for token in (None, "wrong"):
            with OrtserveClient(s.address, tls=tls, token=token, timeout=10) as c:
                with pytest.raises(OrtserveError) as err:
                    c.list_models()
                assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
                assert c.health() == "SERVING"  # health stays open for probes
        # Same server by host name, and over plaintext (which the TLS server cannot talk to).
        with OrtserveClient(f"localhost:{s.port}", tls=tls, token="s3cret", timeout=10) as c:
            assert c.list_models()[0].name == "tiny-classifier"
        # A balanced (ipv4:) target carries no host name: the certificate is checked against the first one.
        with OrtserveClient([f"localhost:{s.port}", s.address], tls=tls, token="s3cret", timeout=10) as c:
            assert [c.health("tiny-classifier") for _ in range(4)] == ["SERVING"] * 4
        with OrtserveClient(s.address, token="s3cret", retries=0, timeout=10) as c:
            with pytest.raises(OrtserveError) as err:
                c.list_models()
            assert err.value.code == grpc.StatusCode.UNAVAILABLE
