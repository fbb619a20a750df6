"""Security checks beyond tests/reliability/test_server_operations.py (which covers TLS + token on a few calls and model
names on four RPCs):

- names and versions that try to leave the repository, on EVERY RPC that takes one;
- a symlinked version directory pointing outside the repository is never loaded;
- with auth enabled (token from the environment), EVERY method of both services, reflection and unknown
  methods answer UNAUTHENTICATED without the exact token; the whole server's health stays open, and nothing
  that names a model answers without the token on any port (metrics, named health); the token never appears
  in the process list or the log;
- TLS with a self-signed certificate made here: a client trusting another CA cannot connect.

(That no Python source of the project unpickles is tests/unit/test_no_unpickling.py.)
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tests.server_process import ServerProcess, repository_with, shared_server
from tritonclient.grpc import service_pb2 as kserve_pb, service_pb2_grpc as kserve_grpc

from testing.tls import self_signed

from protos import grpc_service_pb2, ortserve_pb2
from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc

CLASSIFIER, FILL_MASK, GPT = "tiny-classifier", "tiny-fill-mask", "tiny-gpt"
C = grpc.StatusCode

# ---------------------------------------------------------------------------- names and versions

ESCAPING_NAMES = ["..", "../tiny-classifier", "tiny-classifier/../tiny-gpt", "tiny-classifier/1", "/etc",
                  "..\\tiny-classifier", "tiny-classifier\x00", "%2e%2e%2ftiny-classifier", "~", ".",
                  "tiny-classifier/", " tiny-classifier", "x" * 129, "tiny‐classifier"]  # U+2010 lookalike


def _name_calls(task: pb_grpc.TaskServiceStub, kserve: kserve_grpc.GRPCInferenceServiceStub,
                health: health_pb2_grpc.HealthStub, name: str) -> dict[str, Any]:
    """Every RPC that takes a model name, with `name` in it."""
    texts = [pb.TextInput(text="castle")]
    generate = pb.GenerateRequest(model=name, prompt="x", parameters=pb.GenerationParameters(max_new_tokens=1))
    infer = kserve_pb.ModelInferRequest(model_name=name)
    infer.inputs.add(name="text", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"castle")
    return {
        "Classify": lambda: task.Classify(pb.ClassifyRequest(model=name, inputs=texts), timeout=10),
        "FillMask": lambda: task.FillMask(pb.FillMaskRequest(model=name, texts=["a [MASK]"]), timeout=10),
        "Generate": lambda: task.Generate(generate, timeout=10),
        "GenerateStream": lambda: list(task.GenerateStream(generate, timeout=10)),
        "ModelInfo": lambda: task.ModelInfo(pb.ModelInfoRequest(model=name), timeout=10),
        "ModelReady": lambda: kserve.ModelReady(kserve_pb.ModelReadyRequest(name=name), timeout=10),
        "ModelMetadata": lambda: kserve.ModelMetadata(kserve_pb.ModelMetadataRequest(name=name), timeout=10),
        "ModelInfer": lambda: kserve.ModelInfer(infer, timeout=10),
        "ModelStatistics": lambda: kserve.ModelStatistics(kserve_pb.ModelStatisticsRequest(name=name), timeout=10),
        "RepositoryModelLoad": lambda: kserve.RepositoryModelLoad(
            kserve_pb.RepositoryModelLoadRequest(model_name=name), timeout=10),
        "RepositoryModelUnload": lambda: kserve.RepositoryModelUnload(
            kserve_pb.RepositoryModelUnloadRequest(model_name=name), timeout=10),
        "Health.Check": lambda: health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10),
    }


def test_names_that_leave_the_repository_are_refused_by_every_rpc(tiny_repository: Path) -> None:
    server = shared_server(tiny_repository)
    with grpc.insecure_channel(server.address) as channel:
        task, kserve = pb_grpc.TaskServiceStub(channel), kserve_grpc.GRPCInferenceServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        for name in ESCAPING_NAMES:
            for rpc, call in _name_calls(task, kserve, health, name).items():
                with pytest.raises(grpc.RpcError) as info:
                    call()
                code = info.value.code()
                # Health answers NOT_FOUND for any unknown service; everything else refuses the name itself.
                expected = C.NOT_FOUND if rpc == "Health.Check" else C.INVALID_ARGUMENT
                assert code == expected, (name, rpc, code, info.value.details())
                if expected == C.INVALID_ARGUMENT:
                    assert "name" in info.value.details() or "model" in info.value.details(), (name, rpc)
        # None of it loaded or unloaded anything.
        assert {(m.name, m.state) for m in task.ListModels(pb.ListModelsRequest()).models} == {
            (CLASSIFIER, "SERVING"), (FILL_MASK, "SERVING"), (GPT, "SERVING")}


BAD_VERSION_STRINGS = ["../1", "1/..", "-1", "0", "01x", "1.0", " 1", "1 ", "+1", "0x1", "1e3", "²", "１", "١",
                       "1\x00", "%31"]


def test_versions_that_are_not_positive_integers_are_refused(tiny_repository: Path) -> None:
    server = shared_server(tiny_repository)
    with grpc.insecure_channel(server.address) as channel:
        kserve = kserve_grpc.GRPCInferenceServiceStub(channel)
        task = pb_grpc.TaskServiceStub(channel)
        for version in BAD_VERSION_STRINGS:
            infer = kserve_pb.ModelInferRequest(model_name=CLASSIFIER, model_version=version)
            infer.inputs.add(name="text", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"castle")
            calls = {
                "ModelReady": lambda: kserve.ModelReady(kserve_pb.ModelReadyRequest(name=CLASSIFIER, version=version)),
                "ModelMetadata": lambda: kserve.ModelMetadata(
                    kserve_pb.ModelMetadataRequest(name=CLASSIFIER, version=version)),
                "ModelStatistics": lambda: kserve.ModelStatistics(
                    kserve_pb.ModelStatisticsRequest(name=CLASSIFIER, version=version)),
                "ModelInfer": lambda: kserve.ModelInfer(infer),
            }
            for rpc, call in calls.items():
                with pytest.raises(grpc.RpcError) as info:
                    call()
                assert info.value.code() == C.INVALID_ARGUMENT, (version, rpc, info.value.code())
                assert "version" in info.value.details(), (version, rpc)
        # The task API's versions are int64: negative ones are refused, unknown ones are not found.
        for version, code in ((-1, C.INVALID_ARGUMENT), (-2 ** 63, C.INVALID_ARGUMENT), (2 ** 63 - 1, C.NOT_FOUND)):
            with pytest.raises(grpc.RpcError) as info:
                task.Classify(pb.ClassifyRequest(model=CLASSIFIER, version=version, inputs=[pb.TextInput(text="x")]))
            assert info.value.code() == code and "version" in info.value.details()


def test_a_symlinked_version_directory_is_never_loaded(tiny_repository: Path, tmp_path: Path) -> None:
    repo = repository_with(tiny_repository, tmp_path / "repo", CLASSIFIER)
    outside = tmp_path / "outside" / "package"
    shutil.copytree(repo / CLASSIFIER / "1", outside)  # a valid package, but not in the repository
    (repo / CLASSIFIER / "2").symlink_to(outside, target_is_directory=True)
    with ServerProcess(repo) as proc, grpc.insecure_channel(proc.address) as channel:
        task = pb_grpc.TaskServiceStub(channel)
        assert {(m.name, m.version) for m in task.ListModels(pb.ListModelsRequest()).models} == {(CLASSIFIER, 1)}
        assert task.Classify(pb.ClassifyRequest(model=CLASSIFIER, inputs=[pb.TextInput(text="x")])).version == 1
        with pytest.raises(grpc.RpcError) as info:
            task.Classify(pb.ClassifyRequest(model=CLASSIFIER, version=2, inputs=[pb.TextInput(text="x")]))
        assert info.value.code() == C.NOT_FOUND
        kserve_grpc.GRPCInferenceServiceStub(channel).RepositoryModelLoad(
            kserve_pb.RepositoryModelLoadRequest(model_name=CLASSIFIER))  # an explicit load does not take it either
        assert task.Classify(pb.ClassifyRequest(model=CLASSIFIER, inputs=[pb.TextInput(text="x")])).version == 1


# ---------------------------------------------------------------------------- auth and TLS

TOKEN = "rel-0123456789abcdef-secret"


class Guarded:
    def __init__(self, proc: ServerProcess, cert: Path, other_cert: Path) -> None:
        self.proc, self.cert, self.other_cert = proc, cert, other_cert

    def channel(self, cert: Path | None = None) -> grpc.Channel:
        credentials = grpc.ssl_channel_credentials((cert or self.cert).read_bytes())
        return grpc.secure_channel(self.proc.address, credentials)


@pytest.fixture(scope="module")
def guarded(tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    """TLS (self-signed, made here) + a bearer token given through the environment, not the command line."""
    root = tmp_path_factory.mktemp("guarded")
    repo = repository_with(tiny_repository, root / "repo", CLASSIFIER)
    cert, key = self_signed(root, "server")
    other_cert, _ = self_signed(root, "other")
    saved = os.environ.get("ORTSERVE_AUTH_TOKEN")
    os.environ["ORTSERVE_AUTH_TOKEN"] = TOKEN
    try:
        proc = ServerProcess(repo, ["--tls-cert", str(cert), "--tls-key", str(key), "--http-port", "0",
                                    "--metrics-port", "0"], root_cert=cert)
    finally:
        if saved is None:
            del os.environ["ORTSERVE_AUTH_TOKEN"]
        else:
            os.environ["ORTSERVE_AUTH_TOKEN"] = saved
    try:
        yield Guarded(proc, cert, other_cert)
    finally:
        proc.stop()


def _every_method() -> list[tuple[str, bool, bool]]:
    """(path, request-streaming, response-streaming) of every method the server registers but health."""
    from grpc_reflection.v1alpha import reflection_pb2

    methods = []
    for module in (ortserve_pb2, grpc_service_pb2, reflection_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            methods += [(f"/{service.full_name}/{m.name}", m.client_streaming, m.server_streaming)
                        for m in service.methods]
    return methods + [("/ortserve.v1.TaskService/NoSuchMethod", False, False), ("/no.such.Service/Call", False, False)]


def _invoke(channel: grpc.Channel, path: str, client_streaming: bool, server_streaming: bool,
            metadata: tuple[tuple[str, str], ...]) -> None:
    """Calls `path` with an empty message; raises the RpcError."""
    if client_streaming:
        list(channel.stream_stream(path)(iter([b""]), metadata=metadata, timeout=10))
    elif server_streaming:
        list(channel.unary_stream(path)(b"", metadata=metadata, timeout=10))
    else:
        channel.unary_unary(path)(b"", metadata=metadata, timeout=10)


WRONG_CREDENTIALS = [(), (("authorization", "Bearer wrong"),), (("authorization", TOKEN),),
                     (("authorization", f"Bearer {TOKEN} "),), (("authorization", f"Bearer {TOKEN[:-1]}"),),
                     (("authorization", f"Basic {TOKEN}"),), (("x-api-key", TOKEN),),
                     (("authorization", f"Bearer {TOKEN}x"),)]


def test_every_method_requires_the_exact_token(guarded: Guarded) -> None:
    with guarded.channel() as channel:
        for path, client_streaming, server_streaming in _every_method():
            for metadata in WRONG_CREDENTIALS:
                with pytest.raises(grpc.RpcError) as info:
                    _invoke(channel, path, client_streaming, server_streaming, metadata)
                assert info.value.code() == C.UNAUTHENTICATED, (path, metadata, info.value.code())
                assert TOKEN not in (info.value.details() or "")
        # Health stays open for probes; with the token, the API answers.
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == \
            health_pb2.HealthCheckResponse.SERVING
        auth = (("authorization", f"Bearer {TOKEN}"),)
        task = pb_grpc.TaskServiceStub(channel)
        assert task.Classify(pb.ClassifyRequest(model=CLASSIFIER, inputs=[pb.TextInput(text="x")]),
                             metadata=auth, timeout=10).results
        assert kserve_grpc.GRPCInferenceServiceStub(channel).ServerLive(kserve_pb.ServerLiveRequest(),
                                                                        metadata=auth, timeout=10).live


def _https(guarded: Guarded, url: str, token: str | None = None) -> tuple[int, str]:
    import ssl
    import urllib.error
    import urllib.request

    headers = {"authorization": f"Bearer {token}"} if token else {}
    context = ssl.create_default_context(cafile=str(guarded.cert))
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10, context=context) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_without_the_token_nothing_tells_model_names_on_any_port(guarded: Guarded) -> None:
    """Open without the token: the whole server's liveness and readiness, on every port and protocol (probes).
    Everything that names a model needs it: /metrics on the HTTP port and on the metrics port, grpc health of a
    named service, whose answer for a real model and for an unknown name is the same UNAUTHENTICATED."""
    proc = guarded.proc
    http, metrics = proc.http_url, proc.metrics_url
    assert http.startswith("https://") and metrics.startswith("https://")   # the metrics port has the same TLS
    for url in (f"{http}/health", f"{http}/v2/health/live", f"{http}/v2/health/ready"):
        status, body = _https(guarded, url)
        assert status == 200 and CLASSIFIER not in body, (url, status)
    for url in (f"{http}/metrics", metrics):
        status, body = _https(guarded, url)
        assert status == 401 and CLASSIFIER not in body and "authorization" in body, (url, status, body[:200])
        assert _https(guarded, url, "wrong")[0] == 401
        status, body = _https(guarded, url, TOKEN)
        assert status == 200 and f'model="{CLASSIFIER}"' in body, url
    auth = (("authorization", f"Bearer {TOKEN}"),)
    with guarded.channel() as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "ortserve.v1.TaskService", "inference.GRPCInferenceService"):
            assert health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status == \
                health_pb2.HealthCheckResponse.SERVING
        answers = set()
        for service in (CLASSIFIER, "no-such-model"):
            for metadata in WRONG_CREDENTIALS:
                with pytest.raises(grpc.RpcError) as info:
                    health.Check(health_pb2.HealthCheckRequest(service=service), metadata=metadata, timeout=10)
                answers.add((info.value.code(), info.value.details().replace("invalid bearer token", "missing")
                             .replace("missing 'authorization: Bearer <token>' metadata", "missing")))
            with pytest.raises(grpc.RpcError) as info:
                next(health.Watch(health_pb2.HealthCheckRequest(service=service), timeout=10))
            assert info.value.code() == C.UNAUTHENTICATED
        assert len(answers) == 1 and next(iter(answers))[0] == C.UNAUTHENTICATED, answers  # real = unknown
        assert health.Check(health_pb2.HealthCheckRequest(service=CLASSIFIER), metadata=auth, timeout=10).status == \
            health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as info:
            health.Check(health_pb2.HealthCheckRequest(service="no-such-model"), metadata=auth, timeout=10)
        assert info.value.code() == C.NOT_FOUND
        watch = health.Watch(health_pb2.HealthCheckRequest(service=CLASSIFIER), metadata=auth, timeout=10)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()


def test_the_token_stays_out_of_the_process_list_and_the_log(guarded: Guarded) -> None:
    cmdline = Path(f"/proc/{guarded.proc.proc.pid}/cmdline").read_bytes().replace(b"\x00", b" ").decode()
    assert "--tls-cert" in cmdline and TOKEN not in cmdline
    assert guarded.proc.lines and not any(TOKEN in line for line in guarded.proc.lines)


def test_a_client_trusting_another_certificate_cannot_connect(guarded: Guarded) -> None:
    auth = (("authorization", f"Bearer {TOKEN}"),)
    with guarded.channel(guarded.other_cert) as channel:
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.TaskServiceStub(channel).ListModels(pb.ListModelsRequest(), metadata=auth, timeout=5)
        assert info.value.code() == C.UNAVAILABLE
    with guarded.channel() as channel:  # the right certificate on the same server works
        assert pb_grpc.TaskServiceStub(channel).ListModels(pb.ListModelsRequest(), metadata=auth, timeout=10).models
