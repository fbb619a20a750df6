"""What Ray Serve's proxy costs: the same HTTP load on the plain server and on `python -m server.ray` with 2 replicas.

    python -m bench ray_proxy --out bench/results/ray_proxy.json [--rounds 3] [--seconds 8]
    python -m bench ray_proxy --render-only --out bench/results/ray_proxy.json

Material: the MiniLM embedding package of bench/embeddings.py (bench/results/embeddings-work/repository). Load:
POST /v1/embeddings with one Shakespeare passage, and POST /v2/models/minilm/infer (KServe v2 REST, text mode)
alternately, from 1 and 8 closed-loop client threads, each with its own connection, for a fixed time.

Sides, both started once and kept up (only one under load at a time, alternating round by round):
  plain  `python -m server --http-port P --intra-op-spinning on` (onnxruntime's default threads: both cores,
         spinning as on a machine of its own, one process)
  ray    `python -m server.ray --replicas 2 --num-cpus 1 -- --intra-op-threads 1`: a local Ray cluster on this
         machine, two replicas of one intra-op thread each behind Ray Serve's HTTP proxy
The Ray side's processes use CPU while the plain side is measured (its controller, proxy, raylet, GCS); the
report gives that share, read from /proc (the `python -m server.ray` process and its descendants) over each
plain-side run.
"""
from __future__ import annotations

import logging
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from bench import piece_cli
from bench.harness import Benchmark
from bench.results import header, stamp
from bench.embeddings import MODEL, WORK, ortserve_package
from bench.material import passages
from bench.peer import tree_cpu_seconds
from testing.launch import ChildProcess, ServerProcess, free_port, start_peer

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = (1, 8)
log = logging.getLogger("bench.ray_proxy")


def _ready(url: str) -> bool:
    import urllib.request
    try:
        with urllib.request.urlopen(url + "/v2/health/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def start_ray(repo: Path) -> tuple[ChildProcess, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "server.ray", "--repository", str(repo), "--replicas", "2", "--num-cpus", "1",
           "--http-port", str(port), "--grpc-port", "-1", "--", "--intra-op-threads", "1"]
    url = f"http://127.0.0.1:{port}"
    proc = start_peer(cmd, "python -m server.ray (Ray Serve's proxy)", ready=lambda: _ready(url), timeout=300,
                      env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}, error=RuntimeError)
    return proc, url


def drive(url: str, pool: list[str], clients: int, seconds: float) -> dict[str, Any]:
    """Closed loop, one passage a request: alternately POST /v1/embeddings and KServe v2 REST infer (text mode)."""
    def send(client, i: int) -> int:
        text = pool[i % len(pool)]
        if i % 2:
            r = client.post(url + "/v1/embeddings", json={"model": MODEL, "input": [text]})
        else:
            r = client.post(f"{url}/v2/models/{MODEL}/infer", json={"inputs": [
                {"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}]})
        return 1 if r.status_code == 200 else 0

    r = piece_cli.closed_loop(clients, seconds, send)
    return {"requests_per_s": r["items_per_s"], "failed": r["failed"], "p50_ms": r["p50_ms"],
            "p90_ms": r["p90_ms"], "wall_s": r["wall_s"]}


def run(rounds: int, seconds: float, command: str) -> dict[str, Any]:
    WORK.mkdir(parents=True, exist_ok=True)
    repo = ortserve_package(WORK)
    pool = passages(300, 20, seed=31)
    plain = ServerProcess(repo, ["--http-port", "0", "--intra-op-spinning", "on"], startup_timeout=180)
    plain.__enter__()
    ray_proc, ray_url = start_ray(repo)
    urls = {"plain": plain.http_url, "ray": ray_url}
    try:
        for url in urls.values():
            drive(url, pool, 4, 3.0)
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {str(c): {"plain": [], "ray": []} for c in CLIENTS}
        for r in range(rounds):
            for clients in CLIENTS:
                for side in (("plain", "ray") if r % 2 == 0 else ("ray", "plain")):
                    before = tree_cpu_seconds(ray_proc.pid)
                    res = drive(urls[side], pool, clients, seconds)
                    if side == "plain":
                        res["ray_idle_cpu_share"] = (tree_cpu_seconds(ray_proc.pid) - before) / res["wall_s"]
                    runs[str(clients)][side].append(res)
                    log.info("round %d, %d clients, %s: %.0f req/s, p50 %.1f ms, failed %d", r + 1, clients, side,
                             res["requests_per_s"], res["p50_ms"], res["failed"])
    finally:
        ray_proc.stop(timeout=60)
        plain.stop()
    cells = {}
    for clients, sides in runs.items():
        med = {s: {m: statistics.median(x[m] for x in v) for m in ("requests_per_s", "p50_ms", "p90_ms")}
               for s, v in sides.items()}
        cells[clients] = {"runs": sides, "median": med,
                          "ratio": med["ray"]["requests_per_s"] / med["plain"]["requests_per_s"],
                          "ray_idle_cpu_share": statistics.median(x["ray_idle_cpu_share"] for x in sides["plain"]),
                          "failed": sum(x["failed"] for v in sides.values() for x in v)}
    return {**stamp(command), "cells": cells,
            "rounds": rounds, "seconds": seconds}


def render(result: dict[str, Any]) -> list[str]:
    lines = ["## Ray Serve's proxy vs the plain server (bench/ray_proxy.py)", "",
             header(result),
             "- plain: `python -m server --http-port P --intra-op-spinning on`, one process, onnxruntime's default "
             "threads (both cores), spinning as on a machine of its own",
             "- ray: `python -m server.ray --replicas 2 --num-cpus 1 -- --intra-op-threads 1` (Ray 2.60, a local "
             "cluster; two replicas of one intra-op thread each behind Ray Serve's HTTP proxy)",
             "- Load: MiniLM, alternately POST /v1/embeddings and KServe v2 REST infer (text mode), one passage per "
             f"request, closed-loop clients; {result['rounds']} rounds of {result['seconds']:.0f} s per cell and side, "
             "medians. 'Ray idle' = CPU the Ray side's processes used while the plain side was measured (cores).", "",
             "| clients | plain req/s | ray req/s | ray / plain | p50 ms plain / ray | p90 ms plain / ray | "
             "Ray idle | failed |", "|---|---|---|---|---|---|---|---|"]
    for clients, cell in result["cells"].items():
        p, r = cell["median"]["plain"], cell["median"]["ray"]
        lines.append(f"| {clients} | {p['requests_per_s']:,.0f} | {r['requests_per_s']:,.0f} | {cell['ratio']:.2f} | "
                     f"{p['p50_ms']:.1f} / {r['p50_ms']:.1f} | {p['p90_ms']:.1f} / {r['p90_ms']:.1f} | "
                     f"{cell['ray_idle_cpu_share']:.2f} | {cell['failed']} |")
    return lines


BENCHMARK = Benchmark(summary=__doc__, sides=("ortserve", "ray-serve"), options=piece_cli.options("ray-proxy", rounds=3, seconds=8.0),
                      run=piece_cli.cli("ray-proxy", lambda a: run(a.rounds, a.seconds, a.invocation), render))
