"""The bounded load generator against real server processes: a short CI run with zero errors whose counts
agree with the server's own statistics, its bounds, and the soak script end to end.

The long run (`python scripts/soak.py --clients 64 --seconds 60`) is recorded in docs/RELIABILITY.md.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from tests.server_process import ROOT, ServerProcess, repository_with, shared_server
from tritonclient.grpc import service_pb2 as kserve_pb, service_pb2_grpc as kserve_grpc

from testing.loadgen import KINDS, LoadConfig, LoadConfigError, run_load

CLASSIFIER, FILL_MASK, GPT = "tiny-classifier", "tiny-fill-mask", "tiny-gpt"
MODEL_OF = {"classify": CLASSIFIER, "fill-mask": FILL_MASK, "generate-stream": GPT}
CI_CLIENTS = int(os.environ.get("ORTSERVE_LOAD_CLIENTS", "16"))
CI_SECONDS = float(os.environ.get("ORTSERVE_LOAD_SECONDS", "10"))


def success_counts(address: str) -> dict[str, tuple[int, int]]:
    """model -> (successful, failed) requests, from the server's KServe statistics."""
    with grpc.insecure_channel(address) as channel:
        stats = kserve_grpc.GRPCInferenceServiceStub(channel).ModelStatistics(kserve_pb.ModelStatisticsRequest())
    return {s.name: (s.inference_stats.success.count, s.inference_stats.fail.count) for s in stats.model_stats}


def test_short_mixed_load_has_zero_errors_and_matches_server_statistics(tiny_repository: Path) -> None:
    server = shared_server(tiny_repository)
    before = success_counts(server.address)
    config = LoadConfig(address=server.address, clients=CI_CLIENTS, seconds=CI_SECONDS, max_new_tokens=12,
                        warmup_seconds=min(2.0, CI_SECONDS / 4))
    report = asyncio.run(run_load(config, server_pid=server.proc.pid))
    print(f"\n{CI_CLIENTS} clients x {CI_SECONDS:g} s: {report.requests} requests, p50 {report.latency.p50_ms} ms, "
          f"p99 {report.latency.p99_ms} ms, RSS {report.rss_start_bytes} -> {report.rss_end_bytes}")
    assert report.errors == {}, report.errors
    assert report.ok == report.requests > CI_CLIENTS
    assert report.duration_s < CI_SECONDS + config.request_timeout
    for kind in KINDS:
        k = report.kinds[kind]
        assert k.model == MODEL_OF[kind] and k.ok > 0, (kind, k)
        assert 0 < k.latency.p50_ms <= k.latency.p95_ms <= k.latency.p99_ms <= k.latency.max_ms
    assert report.kinds["generate-stream"].first_chunk.count == report.kinds["generate-stream"].ok
    assert report.rss_start_bytes and report.rss_end_bytes and report.rss_warm_bytes
    assert report.rss_peak_bytes >= max(report.rss_start_bytes, report.rss_end_bytes)

    # Nothing accepted went missing: the server counted exactly the requests the clients saw succeed.
    after = success_counts(server.address)
    for kind in KINDS:
        model = MODEL_OF[kind]
        assert after[model][0] - before[model][0] == report.kinds[kind].ok, kind
        assert after[model][1] == before[model][1], kind


def test_the_request_bound_stops_the_run_before_the_clock(tiny_repository: Path) -> None:
    server = shared_server(tiny_repository)
    started = time.monotonic()
    report = asyncio.run(run_load(LoadConfig(address=server.address, clients=4, seconds=120, max_requests=24,
                                             max_new_tokens=4)))
    assert report.requests == 24 and report.errors == {}
    assert time.monotonic() - started < 60
    assert report.rss_start_bytes is None  # no pid given: no memory figures invented


def test_a_mix_without_a_serving_model_is_refused(tiny_repository: Path, tmp_path: Path) -> None:
    repo = repository_with(tiny_repository, tmp_path / "repo", CLASSIFIER)
    with ServerProcess(repo) as server:
        with pytest.raises(LoadConfigError, match="mix: no SERVING fill-mask model for .fill-mask."):
            asyncio.run(run_load(LoadConfig(address=server.address, clients=1, seconds=1)))


# ---------------------------------------------------------------------------- scripts/soak.py


def soak(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "scripts/soak.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_soak_script_end_to_end(tiny_repository: Path, tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    done = soak("--repository", str(tiny_repository), "--clients", "4", "--seconds", "3", "--warmup-seconds", "1",
                "--max-new-tokens", "6", "--max-rss-growth", "0.5", "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS" in done.stdout and "server exit code on SIGTERM: 0" in done.stdout
    result = json.loads(out.read_text())
    assert result["passed"] is True and result["server_exit_code"] == 0 and result["error_count"] == 0
    assert result["requests"] == result["ok"] > 0 and set(result["kinds"]) == set(KINDS)
    assert result["rss_start_bytes"] > 0 and result["rss_end_bytes"] > 0
    assert [p.name for p in tmp_path.iterdir()] == ["soak.json"]  # written via a temp file, nothing else left


@pytest.mark.parametrize("args, field", [
    (["--clients", "0"], "clients"),
    (["--address", "192.0.2.1:8001"], "address"),
    (["--repository", "/no/such/dir"], "--repository"),
    (["--model", "classify"], "--model"),
    (["--server-pid", "1"], "--server-pid"),
    (["--seconds", "ten"], "--seconds"),
])
def test_soak_script_bad_arguments_are_one_line_exit_2(args: list[str], field: str, tmp_path: Path) -> None:
    done = soak(*args, "--json", str(tmp_path / "never.json"), timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("soak.py: error: ") and field in lines[0], done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "never.json").exists()
