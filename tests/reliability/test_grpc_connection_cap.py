"""A gRPC port whose connection cap is full of idle peers still serves newcomers (issue 40, kind 2, gRPC half;
server/grpc/peers.py).

The probe's case: `--max-connections 16`, 16 gRPC connections that made one health call and went idle; grpc's cap
refused every new client (UNAVAILABLE) until `--grpc-idle-timeout` (300 s) sent the idle ones GOAWAY. Here the cap
is filled by real grpc channels (each with a connection of its own) that made one call, plus one holding a
Health.Watch stream open: new clients are served within seconds, the stream is never cut, and an idle peer whose
connection was closed is served again on its next call.
"""
from __future__ import annotations

import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tests.server_process import ServerProcess, repository_with

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc

CLASSIFIER = "tiny-classifier"
CAP = 8
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]   # channels in one process share a connection otherwise


def _channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=OWN_CONNECTION)


def _check(channel: grpc.Channel, wait: bool = False, timeout: float = 5) -> int:
    request = health_pb2.HealthCheckRequest()
    return health_pb2_grpc.HealthStub(channel).Check(request, timeout=timeout, wait_for_ready=wait).status


def test_new_clients_are_served_when_the_cap_is_full_of_idle_peers(tiny_repository: Path, tmp_path: Path) -> None:
    repo = repository_with(tiny_repository, tmp_path / "repo", CLASSIFIER)
    # The idle timeout stays at its default (300 s): it is not what frees the places.
    with ServerProcess(repo, ["--max-connections", str(CAP)]) as proc:
        watcher = _channel(proc.address)
        watch = health_pb2_grpc.HealthStub(watcher).Watch(health_pb2.HealthCheckRequest())
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING   # a stream open for the whole test
        idle = [_channel(proc.address) for _ in range(CAP - 1)]
        for channel in idle:
            assert _check(channel) == health_pb2.HealthCheckResponse.SERVING
        time.sleep(1.5)   # every idle peer is now quiet for longer than a pause between two calls
        times = []
        newcomers = []
        try:
            for _ in range(3):
                started = time.monotonic()
                channel = _channel(proc.address)
                newcomers.append(channel)
                request = pb.ClassifyRequest(model=CLASSIFIER, inputs=[pb.TextInput(text="the boat left")])
                # wait_for_ready: the client retries its connection (grpc's backoff) instead of failing at once.
                reply = pb_grpc.TaskServiceStub(channel).Classify(request, timeout=20, wait_for_ready=True)
                assert reply.version == 1
                times.append(time.monotonic() - started)
            assert max(times) < 5, times
            assert not watch.done(), "the Health.Watch stream was cut"
            for channel in newcomers:
                channel.close()
            # A peer whose connection was closed while idle is served on its next call.
            assert _check(idle[0], wait=True, timeout=20) == health_pb2.HealthCheckResponse.SERVING
            assert not watch.done(), "the Health.Watch stream was cut"
        finally:
            watch.cancel()
            for channel in (watcher, *idle, *newcomers):
                channel.close()
        assert watch.code() == grpc.StatusCode.CANCELLED   # ended by us, not by the server
        closed_lines = [line for line in proc.lines if "closed the" in line and "idle longest" in line
                        and "grpc" in line]
        assert closed_lines, "no idle connection was closed"
    print(f"\nnew clients served in {', '.join(f'{t:.2f}' for t in times)} s with the cap ({CAP}) full of idle "
          f"peers and one open stream")
