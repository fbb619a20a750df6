"""deploy/kserve/: the KServe runtime and its examples, checked offline (no cluster on this machine).

Kubernetes core objects and every container (the runtime's, and the container fields of an InferenceService's
model) go through kubernetes-validate's strict schemas; KServe's own objects through the JSON schemas kept in
deploy/kserve/schemas/ (where they come from: their $comment). Then what no schema knows: the arguments are
flags the server accepts, the probes, ports and the Prometheus annotation agree with them, the model format is
the package format, and a real server started with those arguments answers the probes' health checks.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import grpc
import jsonschema
import kubernetes_validate
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from modelpkg import FORMAT
from server.runtime.settings import settings_from_args
from tests.server_process import ROOT, ServerProcess

KSERVE = ROOT / "deploy" / "kserve"
# The oldest Kubernetes the manifests claim (a preStop sleep action needs 1.30) and the newest schema shipped.
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
# Fields of a KServe ModelSpec that are KServe's own; the rest are a core Container's.
MODEL_ONLY = ("modelFormat", "runtime", "runtimeVersion", "protocolVersion", "storageUri", "storage", "confidential")


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((KSERVE / name).read_text())


def kserve_schema(kind: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((KSERVE / "schemas" / f"{kind.lower()}.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def as_pod(containers: list[dict[str, Any]], volumes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers}
    if volumes:
        spec["volumes"] = volumes
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"}, "spec": spec}


def validate_core(obj: dict[str, Any]) -> None:
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


def runtime_container() -> dict[str, Any]:
    (container,) = load("servingruntime.yaml")["spec"]["containers"]
    return container


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


# --- the schemas --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["servingruntime.yaml", "inferenceservice.yaml", "inferenceservice-grpc.yaml"])
def test_kserve_objects_match_their_crd_schemas(name: str) -> None:
    obj = load(name)
    errors = sorted(e.message for e in kserve_schema(obj["kind"]).iter_errors(obj))
    assert errors == []


def test_core_objects_and_containers_pass_strict_kubernetes_schemas() -> None:
    validate_core(load("models-pvc.yaml"))
    runtime = load("servingruntime.yaml")["spec"]
    validate_core(as_pod(runtime["containers"], runtime.get("volumes")))
    for name in ("inferenceservice.yaml", "inferenceservice-grpc.yaml"):
        model = load(name)["spec"]["predictor"]["model"]
        container = {k: v for k, v in model.items() if k not in MODEL_ONLY}
        validate_core(as_pod([{"name": "kserve-container", **container}]))


def test_the_validators_refuse_what_kubernetes_or_kserve_would() -> None:
    """Each check above can fail: a typo or a wrong type in each kind of object is caught."""
    runtime = load("servingruntime.yaml")
    wrong_protocol = copy.deepcopy(runtime)
    wrong_protocol["spec"]["protocolVersions"] = ["v2", "grpc-v3"]
    misspelt = copy.deepcopy(runtime)
    misspelt["spec"]["protocolVersion"] = misspelt["spec"].pop("protocolVersions")
    no_format_name = copy.deepcopy(runtime)
    del no_format_name["spec"]["supportedModelFormats"][0]["name"]
    for bad in (wrong_protocol, misspelt, no_format_name):
        assert list(kserve_schema("ClusterServingRuntime").iter_errors(bad))
    isvc = load("inferenceservice.yaml")
    del isvc["spec"]["predictor"]["model"]["modelFormat"]
    assert list(kserve_schema("InferenceService").iter_errors(isvc))

    container = runtime_container()
    container["livenessProbe"]["grpc"]["port"] = "grpc"  # a gRPC probe's port must be a number
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_core(as_pod([container]))
    container = runtime_container()
    container["securityContext"]["runAsNonroot"] = True  # misspelt: strict schemas refuse unknown fields
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_core(as_pod([container]))


# --- what the schemas cannot know ---------------------------------------------------------------------------

def test_runtime_arguments_ports_probes_and_format_agree_with_the_server(tmp_path: Path) -> None:
    runtime = load("servingruntime.yaml")["spec"]
    container = runtime_container()
    args = container["args"]
    assert flag(args, "--repository") == "/mnt/models"  # where KServe's storage initializer puts storageUri
    settings = settings_from_args([*args, "--repository", str(tmp_path)], environ={})  # flags the server knows
    assert settings.host == "0.0.0.0"
    assert (settings.http_port, settings.port, settings.metrics_port) == (8080, 8081, 8082)  # KServe's ports

    assert container["name"] == "kserve-container"
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [("http1", settings.http_port)]
    assert container["readinessProbe"]["grpc"] == {"port": settings.port, "service": ""}
    assert container["livenessProbe"]["grpc"] == {"port": settings.port, "service": "liveness"}
    assert runtime["annotations"]["prometheus.kserve.io/port"] == str(settings.metrics_port)
    assert set(runtime["protocolVersions"]) == {"v2", "grpc-v2"}
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    assert security["allowPrivilegeEscalation"] is False and security["capabilities"]["drop"] == ["ALL"]

    name, version = FORMAT.split("/")
    assert runtime["supportedModelFormats"][0] == {"name": name, "version": version, "autoSelect": True,
                                                   "priority": 1}
    for example in ("inferenceservice.yaml", "inferenceservice-grpc.yaml"):
        model = load(example)["spec"]["predictor"]["model"]
        assert model["modelFormat"] == {"name": name, "version": version}
        assert model["runtime"] == load("servingruntime.yaml")["metadata"]["name"]
    grpc_model = load("inferenceservice-grpc.yaml")["spec"]["predictor"]["model"]
    assert grpc_model["protocolVersion"] == "grpc-v2"
    assert grpc_model["ports"] == [{"name": "h2c", "containerPort": settings.port, "protocol": "TCP"}]
    # The pod outlives the preStop pause plus the drain.
    grace = load("inferenceservice.yaml")["spec"]["predictor"]["terminationGracePeriodSeconds"]
    assert grace > float(flag(args, "--grace-period")) + container["lifecycle"]["preStop"]["sleep"]["seconds"]


def test_a_server_started_with_the_runtime_arguments_answers_its_probes_without_a_token(
        tiny_repository: Path) -> None:
    """The kubelet's gRPC probes send no metadata: with a bearer token on, both probe services stay open."""
    container = runtime_container()
    args = list(container["args"])
    for name, value in (("--repository", str(tiny_repository)), ("--host", "127.0.0.1"), ("--port", "0"),
                        ("--http-port", "-1"), ("--metrics-port", "-1")):
        args[args.index(name) + 1] = value
    with ServerProcess(tiny_repository, [*args, "--auth-token", "probe-secret"]) as server:
        with grpc.insecure_channel(server.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for probe in ("readinessProbe", "livenessProbe"):
                request = health_pb2.HealthCheckRequest(service=container[probe]["grpc"]["service"])
                assert health.Check(request, timeout=10).status == health_pb2.HealthCheckResponse.SERVING, probe
            # and the log is JSON lines, as the runtime asks
            assert any(line.startswith("{") and json.loads(line).get("msg") for line in server.lines)
