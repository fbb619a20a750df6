"""ortserve on Ray Serve across two nodes (the extra `ray`; marker ray_cluster, run by CI, about 1.5-2 min).

A head and a worker started with `ray start`, each in its own network namespace (testing/raycluster.py), the
application deployed with `python -m server.ray --detach` (2 replicas: one per node, shown by the replica
processes in each namespace), and a bounded mixed HTTP load (testing/httpmix.py: classify, embed, streamed
completions) through the head's Ray Serve proxy from the root namespace (and a few gRPC calls through its gRPC
proxy). Then:
  (a) downscale 2 -> 1 and a redeploy with other flags (2 new replicas) under load: no request fails;
  (b) SIGKILL of the worker's replica under load: first-try failures at most the requests that replica can hold
      (max_ongoing_requests) and at most those in flight at the kill, none left once classify and embed are
      retried, and the deployment is back to 2 replicas within RECOVERY_BOUND_S.
The figures are printed (pytest -s) and recorded in docs/RELIABILITY.md.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.server_process import ROOT, repository_with
from testing.httpmix import HttpMix, MixConfig, summary

pytest.importorskip("ray.serve", reason="the optional extra 'ray' is not installed (pip install -e '.[ray]')")

from testing.raycluster import RayCluster, namespaces_available  # noqa: E402

pytestmark = [pytest.mark.ray_cluster, pytest.mark.timeout(300)]
REPLICA = "ServeReplica:ortserve:ortserve"
MAX_ONGOING = 8
RECOVERY_BOUND_S = 30.0
PORT = 8000
GRPC_PORT = 9000


@pytest.fixture(scope="module")
def ray_repository(tiny_repository: Path, tiny_checkpoints, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import one_torch_thread

    from export import ExportConfig, export_checkpoint

    repo = repository_with(tiny_repository, tmp_path_factory.mktemp("ray") / "repo", "tiny-classifier", "tiny-gpt")
    with one_torch_thread():
        export_checkpoint(ExportConfig(checkpoint=tiny_checkpoints.mlm, task="embed", repository=repo,
                                       name="tiny-embed", pooling="cls", normalize="off"))
    return repo


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    why = namespaces_available()
    if why is not None:
        pytest.skip(f"two Ray nodes in network namespaces: {why}")
    # Spread the proxy's requests over both nodes' replicas (by default it prefers its own node's replica, and the
    # worker's would see only the overflow).
    with RayCluster(num_cpus=1, env={"RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0"}) as running:
        yield running


def deploy(cluster: RayCluster, repository: Path, *args: str) -> float:
    """`python -m server.ray --detach` in the head's namespace; the seconds it took (it returns when ready)."""
    started = time.monotonic()
    cluster.exec(cluster.head, sys.executable, "-m", "server.ray", "--address", cluster.gcs, "--detach", "--repository",
                 str(repository), "--http-host", "0.0.0.0", "--http-port", str(PORT), "--grpc-port", str(GRPC_PORT), "--max-ongoing-requests",
                 str(MAX_ONGOING), "--graceful-shutdown-timeout", "15", *args, timeout=240)
    return time.monotonic() - started


def replicas(cluster: RayCluster) -> dict[str, list[int]]:
    return {node.namespace: cluster.processes(node, REPLICA) for node in (cluster.head, cluster.worker)}


def wait_for(condition, timeout: float, what: str) -> float:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"{what} not within {timeout:.0f} s")


def answered(load: HttpMix, more: int, timeout: float = 60.0) -> None:
    """Until `more` further requests of the load were answered (ok or not): the load is flowing at this point of the
    scenario. (A fixed sleep here waited seconds longer than the load needs to go through.)"""
    target = len(load.outcomes) + more
    wait_for(lambda: len(load.outcomes) >= target, timeout, f"{more} more answers of the load")


def mix(cluster: RayCluster, **overrides) -> HttpMix:  # type: ignore[no-untyped-def]
    config = MixConfig(host=cluster.head.address, port=PORT, classifier="tiny-classifier", embedder="tiny-embed",
                       generator="tiny-gpt", clients=6, max_requests=5000, stream_tokens=64)
    for key, value in overrides.items():
        setattr(config, key, value)
    return HttpMix(config)


def report(name: str, figures: dict) -> None:
    print(f"\n[ray-serve] {name}: {json.dumps(figures)}")


def grpc_through_the_proxy(cluster: RayCluster) -> None:
    """The task API and KServe v2 over Ray Serve's gRPC proxy: unary, server streaming, and the server's own status
    codes (server/ray/grpc_bridge.py)."""
    import grpc

    from protos import grpc_service_pb2 as kpb
    from protos import grpc_service_pb2_grpc as krpc
    from protos import ortserve_pb2 as pb
    from protos import ortserve_pb2_grpc as rpc

    with grpc.insecure_channel(f"{cluster.head.address}:{GRPC_PORT}") as channel:
        task, kserve = rpc.TaskServiceStub(channel), krpc.GRPCInferenceServiceStub(channel)
        answer = task.Classify(pb.ClassifyRequest(model="tiny-classifier", inputs=[pb.TextInput(text="a fine day")]),
                               timeout=30)
        assert len(answer.results) == 1 and answer.results[0].label
        chunks = list(task.GenerateStream(pb.GenerateRequest(
            model="tiny-gpt", prompt="once upon", parameters=pb.GenerationParameters(max_new_tokens=8, ignore_eos=True)),
            timeout=30))
        assert chunks[-1].final and chunks[-1].usage.completion_tokens == 8
        assert kserve.ServerReady(kpb.ServerReadyRequest(), timeout=30).ready
        with pytest.raises(grpc.RpcError) as refused:
            task.Classify(pb.ClassifyRequest(model="nope", inputs=[pb.TextInput(text="x")]), timeout=30)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND and "model" in refused.value.details()


def test_bad_arguments_are_one_line_and_exit_2(tmp_path: Path) -> None:
    for argv, field in ((["--repository", str(tmp_path / "missing")], "--repository"),
                        (["--repository", str(tmp_path), "--detach"], "--detach"),
                        (["--repository", str(tmp_path), "--", "--max-batch-size", "0"], "--max-batch-size")):
        run = subprocess.run([sys.executable, "-m", "server.ray", *argv], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 2, run.stderr
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("python -m server.ray: error: ") and field in lines[0], lines


def test_two_nodes_downscale_redeploy_and_a_killed_replica(cluster: RayCluster, ray_repository: Path) -> None:
    took = deploy(cluster, ray_repository, "--replicas", "2")
    placed = replicas(cluster)
    assert [len(p) for p in placed.values()] == [1, 1], placed  # one replica on each node
    report("deployed", {"seconds": round(took, 1), "replica pids by node": placed})
    grpc_through_the_proxy(cluster)

    # (a) downscale and redeploy under load: Ray Serve stops routing to a replica it removes and lets it finish
    load = mix(cluster).start()
    answered(load, 12)
    down = deploy(cluster, ray_repository, "--replicas", "1")
    wait_for(lambda: sum(map(len, replicas(cluster).values())) == 1, 60, "one replica after the downscale")
    answered(load, 12)   # served by the one replica left
    redeploy = deploy(cluster, ray_repository, "--replicas", "2", "--", "--max-batch-size", "8")
    wait_for(lambda: sorted(map(len, replicas(cluster).values())) == [1, 1], 60, "two replicas after the redeploy")
    answered(load, 24)   # served by the two new replicas
    outcomes = load.stop()
    figures = summary(outcomes)
    report("(a) downscale 2->1, redeploy 2 with other flags", {**figures, "downscale_s": round(down, 1),
                                                               "redeploy_s": round(redeploy, 1),
                                                               "requests by replica": served_by_replica(cluster)})
    assert figures["sent"] > 30 and all(figures[f"{k}_sent"] > 5 for k in ("classify", "embed", "stream"))
    assert figures["failed"] == 0, [o.errors for o in outcomes if not o.ok][:5]
    assert replicas(cluster) != placed  # the redeploy replaced both replicas

    # (b) SIGKILL of the worker's replica under load, idempotent calls retried by the client
    (victim,) = replicas(cluster)[cluster.worker.namespace]
    load = mix(cluster, retry_idempotent=True).start()
    answered(load, 12)
    started_before = started_replicas(cluster)
    inflight_at_kill = load.inflight
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    recovered = wait_for(lambda: sorted(map(len, replicas(cluster).values())) == [1, 1]
                         and victim not in replicas(cluster)[cluster.worker.namespace], RECOVERY_BOUND_S,
                         "a new replica in place of the killed one")
    ready = wait_for(lambda: started_replicas(cluster) > started_before, RECOVERY_BOUND_S,
                     "the new replica's data plane loaded")
    answered(load, 24)   # served with the new replica in place
    outcomes = load.stop()
    figures = summary(outcomes)
    near_kill = [o for o in outcomes if o.errors and o.started <= killed_at + RECOVERY_BOUND_S]
    report("(b) SIGKILL of a replica", {**figures, "inflight_at_kill": inflight_at_kill,
                                        "replica_process_back_s": round(recovered, 1),
                                        "serving_again_s": round(recovered + ready, 1),
                                        "first_errors": sorted({e for o in near_kill for e in o.errors[:1]})[:3],
                                        "requests by replica": served_by_replica(cluster)})
    assert figures["failed_first_try"] <= min(MAX_ONGOING, inflight_at_kill), figures
    assert figures["classify_failed"] == 0 and figures["embed_failed"] == 0, figures
    assert figures["stream_failed"] <= min(MAX_ONGOING, inflight_at_kill), figures
    assert figures["sent"] > 30


def served_by_replica(cluster: RayCluster) -> dict[str, int]:
    """Requests each replica answered, by its Ray Serve access log."""
    counts: dict[str, int] = {}
    for line in cluster.serve_log("replica").splitlines():
        found = re.match(r"INFO \S+ \S+ ortserve_ortserve (\w+) \S+ -- (POST|GET) ", line)
        if found:
            counts[found.group(1)] = counts.get(found.group(1), 0) + 1
    return counts


def started_replicas(cluster: RayCluster) -> int:
    """Replicas whose constructor finished (the data plane loaded), by the Serve controller's log."""
    return len(re.findall(r"Replica\(id='\w+', deployment='ortserve', app='ortserve'\) started successfully",
                          cluster.serve_log("controller")))
