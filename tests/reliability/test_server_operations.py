"""Server processes under operations: deadlines, SIGTERM drain, version swap under load, a corrupted
package, names that try to leave the repository, TLS and bearer-token auth."""
from __future__ import annotations

import datetime
import ipaddress
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import grpc
import httpx2 as httpx
import pytest
import tritonclient.grpc as triton
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tests.server_process import ServerProcess, metrics_url_of, repository_with, rpc_error, sample, wait_ready
from testing.launch import wait_for
from tokenizers import Tokenizer
from tritonclient.grpc import service_pb2 as kserve_pb, service_pb2_grpc as kserve_grpc
from tritonclient.utils import InferenceServerException

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc

CLASSIFIER = "tiny-classifier"


def classify(text: str = "the boat left the harbour", model: str = CLASSIFIER) -> pb.ClassifyRequest:
    return pb.ClassifyRequest(model=model, inputs=[pb.TextInput(text=text)])


# ---------------------------------------------------------------- deadline and SIGTERM (slow batcher)

QUEUE_DELAY_MS = 1500  # a batch waits this long for company: requests sit in the queue, observably


@pytest.fixture(scope="module")
def slow_batcher(tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = repository_with(tiny_repository, tmp_path_factory.mktemp("slow"), CLASSIFIER)
    proc = ServerProcess(repo, ["--max-queue-delay-ms", str(QUEUE_DELAY_MS), "--grace-period", "10",
                                "--metrics-port", "0"])
    try:
        wait_ready(proc.address)
        yield proc
    finally:
        proc.stop()


def _stats(address: str) -> Any:
    return triton.InferenceServerClient(address).get_inference_statistics(CLASSIFIER).model_stats[0]


def test_expired_request_is_dropped_before_compute(slow_batcher: ServerProcess) -> None:
    before = _stats(slow_batcher.address)
    with grpc.insecure_channel(slow_batcher.address) as channel:
        stub = pb_grpc.TaskServiceStub(channel)
        err = rpc_error(lambda: stub.Classify(classify(), timeout=0.3))
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # The server saw the request (counted as failed) ...
    wait_for(lambda: _stats(slow_batcher.address).inference_stats.fail.count == before.inference_stats.fail.count + 1,
             5, "the failed request to be counted")
    time.sleep(QUEUE_DELAY_MS / 1000 + 0.3)  # ... and its batch window has long closed ...
    after = _stats(slow_batcher.address)
    # ... yet nothing ran: no onnxruntime execution, no rows inferred.
    assert after.execution_count == before.execution_count
    assert after.inference_count == before.inference_count


def test_sigterm_drains_accepted_requests_then_exits_0(slow_batcher: ServerProcess) -> None:
    metrics = metrics_url_of(slow_batcher)
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    def queued() -> float:
        text = urllib.request.urlopen(metrics, timeout=5).read().decode()
        samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        return sample(samples, "ortserve_queued_requests", model=CLASSIFIER)

    with grpc.insecure_channel(slow_batcher.address) as channel:
        stub = pb_grpc.TaskServiceStub(channel)
        texts = [f"sail number {i} crossed the bay" for i in range(6)]
        futures = [stub.Classify.future(classify(t), timeout=30) for t in texts]
        wait_for(lambda: queued() == 6, 5, "six requests queued")
        slow_batcher.proc.send_signal(signal.SIGTERM)

        health = health_pb2_grpc.HealthStub(channel)
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        wait_for(lambda: health.Check(health_pb2.HealthCheckRequest(service="")).status == not_serving, 5,
                 "health NOT_SERVING")
        late = rpc_error(lambda: stub.Classify(classify("too late")))
        assert late.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in late.details()

        results = [f.result(timeout=30) for f in futures]  # every accepted request is answered
        assert [len(r.results) for r in results] == [1] * 6
    assert slow_batcher.proc.wait(timeout=20) == 0
    log = "".join(slow_batcher.lines)
    assert "draining: 6 request(s) in flight" in log and "stopped" in log


# ---------------------------------------------------------------- the event loop under both front doors

@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_both_front_doors_and_the_drain_work_on_either_event_loop(tiny_repository: Path, tmp_path: Path,
                                                                    loop: str) -> None:
    """gRPC, HTTP (uvicorn on the same loop), a generation stream and SIGTERM's drain, on each loop."""
    import json
    import urllib.request

    repo = repository_with(tiny_repository, tmp_path / "repo", CLASSIFIER, "tiny-gpt")
    with ServerProcess(repo, ["--event-loop", loop, "--http-port", "0"]) as proc:
        wait_ready(proc.address)
        with grpc.insecure_channel(proc.address) as channel:
            stub = pb_grpc.TaskServiceStub(channel)
            assert len(stub.Classify(classify(), timeout=30).results) == 1
            params = pb.GenerationParameters(max_new_tokens=5, ignore_eos=True)
            stream = stub.GenerateStream(pb.GenerateRequest(model="tiny-gpt", prompt="the boat", parameters=params),
                                         timeout=30)
            assert sum(len(chunk.tokens) for chunk in stream) == 5
        body = json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                                       "data": ["the boat left the harbour"]}]}).encode()
        request = urllib.request.Request(f"{proc.http_url}/v2/models/{CLASSIFIER}/infer", data=body,
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200 and json.loads(response.read())["model_name"] == CLASSIFIER
        proc.proc.send_signal(signal.SIGTERM)
        assert proc.proc.wait(timeout=20) == 0
    assert f"event loop: {loop}" in "".join(proc.lines)


# ---------------------------------------------------------------- version swap under load

def test_new_version_swaps_in_under_load_without_failures(tiny_repository: Path, tmp_path: Path) -> None:
    repo = repository_with(tiny_repository, tmp_path / "repo", CLASSIFIER)
    with ServerProcess(repo, ["--poll-interval", "0.2"]) as proc:
        wait_ready(proc.address)
        stop = threading.Event()
        seen: list[list[int]] = [[] for _ in range(3)]
        failures: list[str] = []

        def client(log: list[int]) -> None:
            with grpc.insecure_channel(proc.address) as channel:
                stub = pb_grpc.TaskServiceStub(channel)
                while not stop.is_set():
                    try:
                        log.append(stub.Classify(classify(), timeout=10).version)
                    except grpc.RpcError as exc:
                        failures.append(f"{exc.code()}: {exc.details()}")

        threads = [threading.Thread(target=client, args=(log,)) for log in seen]
        for t in threads:
            t.start()
        try:
            wait_for(lambda: all(len(log) > 5 for log in seen), 20, "clients running on version 1")
            staging = repo / CLASSIFIER / ".tmp-publish"  # published the way export does: write, then rename
            shutil.copytree(repo / CLASSIFIER / "1", staging)
            os.rename(staging, repo / CLASSIFIER / "2")
            wait_for(lambda: all(log and log[-1] == 2 for log in seen), 30, "clients switched to version 2")
            marks = [len(log) for log in seen]
            wait_for(lambda: all(len(log) > m + 5 for log, m in zip(seen, marks)), 20, "traffic on version 2")
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=30)
        assert not failures, failures[:5]
        for log in seen:
            assert log[0] == 1 and log[-1] == 2
            assert log == sorted(log)  # once a client saw version 2 it never got version 1 again

        with grpc.insecure_channel(proc.address) as channel:
            stub = pb_grpc.TaskServiceStub(channel)
            info = stub.ModelInfo(pb.ModelInfoRequest(model=CLASSIFIER))
            assert info.status.version == 2 and info.status.state == "SERVING" and list(info.versions) == [1, 2]
            states = {(m.version, m.state) for m in stub.ListModels(pb.ListModelsRequest()).models}
            assert states == {(1, "UNLOADED"), (2, "SERVING")}
            # An explicit RepositoryModelLoad picks up a new version at once, without waiting for a poll.
            shutil.copytree(repo / CLASSIFIER / "2", repo / CLASSIFIER / ".tmp-3")
            os.rename(repo / CLASSIFIER / ".tmp-3", repo / CLASSIFIER / "3")
            triton.InferenceServerClient(proc.address).load_model(CLASSIFIER)
            assert stub.Classify(classify()).version == 3



GPT = "tiny-gpt"


def test_logprobs_requests_across_version_swaps_all_succeed(tiny_repository: Path, tmp_path: Path) -> None:
    """Logprobs requests running while new versions are published and loaded, over HTTP (streamed with echo, and
    unary with a token-id prompt and echo) and gRPC (streamed): none fails, since each token's text comes with the
    token from the version that generated it (the doors look no version up again); over gRPC every token's
    `token` is its text as the tokenizer decodes it alone."""
    repo = repository_with(tiny_repository, tmp_path / "repo", GPT)
    tokenizer = Tokenizer.from_file(str(repo / GPT / "1" / "tokenizer.json"))
    prompt = "To be, or not to be"
    prompt_ids = tokenizer.encode(prompt).ids
    new_tokens = 110     # long enough that requests are in flight across each swap (12 prompt tokens + 110 fit 128)
    with ServerProcess(repo, ["--http-port", "0"]) as proc:
        url = f"{proc.http_url}/v1/completions"
        stop = threading.Event()
        spans: dict[str, list[tuple[float, float]]] = {"http stream": [], "http unary": [], "grpc": []}
        failures: list[str] = []
        grpc_versions: set[int] = set()

        def http_stream(client: httpx.Client) -> None:
            body = {"model": GPT, "prompt": prompt, "max_tokens": new_tokens, "logprobs": 2, "echo": True,
                    "stream": True, "ignore_eos": True}
            with client.stream("POST", url, json=body) as response:
                assert response.status_code == 200, response.read()
                lines = [line for line in response.iter_lines() if line]
            assert lines[-1] == "data: [DONE]", lines[-3:]
            events = [json.loads(line[len("data: "):]) for line in lines[:-1]]
            assert not [e for e in events if "error" in e], [e for e in events if "error" in e]
            texts = [t for e in events for c in e["choices"] for t in (c["logprobs"] or {}).get("tokens", [])]
            assert len(texts) == len(prompt_ids) + new_tokens and texts[0] == tokenizer.decode(prompt_ids[:1])
            assert events[0]["choices"][0]["text"] == prompt and events[-1]["choices"][0]["finish_reason"] == "length"

        def http_unary(client: httpx.Client) -> None:
            body = {"model": GPT, "prompt": prompt_ids, "max_tokens": new_tokens, "logprobs": 1, "echo": True,
                    "ignore_eos": True}
            response = client.post(url, json=body)
            assert response.status_code == 200, response.text
            choice = response.json()["choices"][0]
            assert choice["text"].startswith(tokenizer.decode(prompt_ids))
            assert len(choice["logprobs"]["tokens"]) == len(prompt_ids) + new_tokens

        def grpc_stream(stub: pb_grpc.TaskServiceStub) -> None:
            request = pb.GenerateRequest(model=GPT, prompt=prompt, parameters=pb.GenerationParameters(
                max_new_tokens=new_tokens, ignore_eos=True, logprobs=True, top_logprobs=2))
            tokens = []
            for message in stub.GenerateStream(request, timeout=60):
                tokens += message.tokens
                grpc_versions.add(message.version)
            assert len(tokens) == new_tokens
            assert [t.token for t in tokens] == [tokenizer.decode([t.token_id], skip_special_tokens=False)
                                                 for t in tokens]

        def loop(kind: str, one: Any) -> None:
            with httpx.Client(timeout=60) as client, grpc.insecure_channel(proc.address) as channel:
                target = pb_grpc.TaskServiceStub(channel) if kind == "grpc" else client
                while not stop.is_set():
                    started = time.monotonic()
                    try:
                        one(target)
                    except Exception as exc:  # noqa: BLE001 - every failure is reported at the end
                        failures.append(f"{kind}: {exc!r}"[:400])
                    spans[kind].append((started, time.monotonic()))

        threads = [threading.Thread(target=loop, args=args) for args in (
            ("http stream", http_stream), ("http stream", http_stream), ("http unary", http_unary),
            ("grpc", grpc_stream))]
        for thread in threads:
            thread.start()
        swaps: list[tuple[float, float]] = []
        try:
            wait_for(lambda: all(len(s) >= 2 for s in spans.values()), 60, "every client running on version 1")
            loader = triton.InferenceServerClient(proc.address)
            for version in (2, 3, 4):
                staging = repo / GPT / ".tmp-publish"   # published the way export does: write, then rename
                shutil.copytree(repo / GPT / "1", staging)
                os.rename(staging, repo / GPT / str(version))
                began = time.monotonic()
                loader.load_model(GPT)                  # loads the new version and retires the one serving
                swaps.append((began, time.monotonic()))
                marks = {k: len(s) for k, s in spans.items()}
                wait_for(lambda: all(len(s) >= marks[k] + 2 for k, s in spans.items()), 60, "traffic goes on")
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
        assert not failures, failures[:5]
        assert grpc_versions >= {1, 4}, grpc_versions
        # Requests that began before a swap started and ended after it: they straddled a version's retirement.
        straddled = {kind: sum(1 for a, b in s for began, done in swaps if a < began and b > done)
                     for kind, s in spans.items()}
        assert straddled["http stream"] >= 1 and straddled["grpc"] >= 1, straddled


# ---------------------------------------------------------------- corrupted package, traversal, TLS, auth

TOKEN = "s3cret-token"
MAX_MESSAGE = 64 * 1024


def _self_signed(directory: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class Secured:
    def __init__(self, proc: ServerProcess, cert: Path, repo: Path) -> None:
        self.proc, self.cert, self.repo = proc, cert, repo
        self.credentials = grpc.ssl_channel_credentials(cert.read_bytes())

    def channel(self) -> grpc.Channel:
        return grpc.secure_channel(self.proc.address, self.credentials)


AUTH = (("authorization", f"Bearer {TOKEN}"),)


@pytest.fixture(scope="module")
def secured(tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("secured")
    repo = repository_with(tiny_repository, root / "repo", CLASSIFIER)
    broken = repo / "broken" / "1"
    shutil.copytree(repo / CLASSIFIER / "1", broken)
    target = broken / "model.int8.onnx"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit-pattern in the weights: the parity report's sha256 no longer matches
    target.write_bytes(bytes(data))
    shutil.copytree(repo / CLASSIFIER, root / "outside")  # a valid model next to (not inside) the repository
    (repo / "linked").symlink_to(root / "outside", target_is_directory=True)
    cert, key = _self_signed(root)
    # (ServerProcess waits for grpc.health.v1 SERVING over TLS, without a token: health stays open.)
    proc = ServerProcess(repo, ["--tls-cert", str(cert), "--tls-key", str(key), "--auth-token", TOKEN,
                                "--max-message-bytes", str(MAX_MESSAGE)], root_cert=cert)
    secured = Secured(proc, cert, repo)
    try:
        yield secured
    finally:
        proc.stop()


def test_bearer_token_is_required_over_tls(secured: Secured) -> None:
    with secured.channel() as channel:
        stub = pb_grpc.TaskServiceStub(channel)
        missing = rpc_error(lambda: stub.Classify(classify()))
        assert missing.code() == grpc.StatusCode.UNAUTHENTICATED and "authorization" in missing.details()
        wrong = rpc_error(lambda: stub.Classify(classify(), metadata=(("authorization", "Bearer nope"),)))
        assert wrong.code() == grpc.StatusCode.UNAUTHENTICATED
        stream = rpc_error(lambda: list(stub.GenerateStream(pb.GenerateRequest(model="x", prompt="y"))))
        assert stream.code() == grpc.StatusCode.UNAUTHENTICATED
        assert stub.Classify(classify(), metadata=AUTH).results[0].label

    client = triton.InferenceServerClient(secured.proc.address, ssl=True, root_certificates=str(secured.cert))
    headers = {"authorization": f"Bearer {TOKEN}"}
    assert client.is_model_ready(CLASSIFIER, headers=headers)
    with pytest.raises(InferenceServerException) as info:
        client.is_server_live()
    assert info.value.status() == "StatusCode.UNAUTHENTICATED"


def test_plaintext_client_cannot_talk_to_tls_server(secured: Secured) -> None:
    with grpc.insecure_channel(secured.proc.address) as channel:
        err = rpc_error(lambda: pb_grpc.TaskServiceStub(channel).ListModels(pb.ListModelsRequest(), timeout=3,
                                                                             metadata=AUTH))
        assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_corrupted_package_is_not_serving_with_reason_others_serve(secured: Secured) -> None:
    reason = "sha256 mismatch for model.int8.onnx"
    with secured.channel() as channel:
        stub = pb_grpc.TaskServiceStub(channel)
        states = {m.name: (m.state, m.reason) for m in stub.ListModels(pb.ListModelsRequest(), metadata=AUTH).models}
        assert states[CLASSIFIER] == ("SERVING", "")
        assert states["broken"][0] == "NOT_SERVING" and reason in states["broken"][1]
        info = stub.ModelInfo(pb.ModelInfoRequest(model="broken"), metadata=AUTH)
        assert info.status.state == "NOT_SERVING" and reason in info.status.reason
        err = rpc_error(lambda: stub.Classify(classify(model="broken"), metadata=AUTH))
        assert err.code() == grpc.StatusCode.UNAVAILABLE and reason in err.details()
        assert stub.Classify(classify(), metadata=AUTH).results

        kserve = kserve_grpc.GRPCInferenceServiceStub(channel)
        assert not kserve.ModelReady(kserve_pb.ModelReadyRequest(name="broken"), metadata=AUTH).ready
        meta = rpc_error(lambda: kserve.ModelMetadata(kserve_pb.ModelMetadataRequest(name="broken"), metadata=AUTH))
        assert meta.code() == grpc.StatusCode.UNAVAILABLE and reason in meta.details()
        index = kserve.RepositoryIndex(kserve_pb.RepositoryIndexRequest(), metadata=AUTH)
        assert any(m.name == "broken" and m.state == "NOT_SERVING" and reason in m.reason for m in index.models)
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(service="broken"), metadata=AUTH).status == \
            health_pb2.HealthCheckResponse.NOT_SERVING
    assert any("broken" in line and reason in line for line in secured.proc.lines)  # and in the log


@pytest.mark.parametrize("name", ["../outside", "linked", "..", "tiny-classifier/../../outside", "/etc"])
def test_model_names_cannot_leave_the_repository(secured: Secured, name: str) -> None:
    with secured.channel() as channel:
        stub = pb_grpc.TaskServiceStub(channel)
        kserve = kserve_grpc.GRPCInferenceServiceStub(channel)
        calls = [
            lambda: stub.Classify(classify(model=name), metadata=AUTH),
            lambda: stub.ModelInfo(pb.ModelInfoRequest(model=name), metadata=AUTH),
            lambda: kserve.RepositoryModelLoad(kserve_pb.RepositoryModelLoadRequest(model_name=name), metadata=AUTH),
            lambda: kserve.ModelMetadata(kserve_pb.ModelMetadataRequest(name=name), metadata=AUTH),
        ]
        for call in calls:
            err = rpc_error(call)
            # "linked" is a well-formed name whose directory resolves outside: refused, never loaded.
            assert err.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), err.details()
        load = rpc_error(calls[2])
        assert load.code() == grpc.StatusCode.INVALID_ARGUMENT and "model_name" in load.details()
        assert name not in {m.name for m in stub.ListModels(pb.ListModelsRequest(), metadata=AUTH).models}


def test_messages_over_the_size_limit_are_refused(secured: Secured) -> None:
    with secured.channel() as channel:
        stub = pb_grpc.TaskServiceStub(channel)
        big = classify(text="harbour " * (MAX_MESSAGE // 8 + 100))
        err = rpc_error(lambda: stub.Classify(big, metadata=AUTH))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert stub.Classify(classify(), metadata=AUTH).results  # the connection still serves normal calls
