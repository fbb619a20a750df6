"""What the small peer benchmarks share (bench.embeddings, bench.token_classify, bench.ray_proxy): their options
(--out, --rounds, --seconds, --docs, --render-only) and their run: measure (or with --render-only re-read) a result
JSON, write it and render it into its marked block of docs/BENCHMARKS.md (bench/results.py); and their HTTP load.

    BENCHMARK = Benchmark(summary=__doc__, sides=(...), options=piece_cli.options("embeddings", rounds=3,
                          seconds=6.0), run=piece_cli.cli("embeddings", lambda a: run(...), render))
"""
from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.results import publish, read_json
from bench.stats import percentile
from testing.closedloop import counting, drive

ROOT = Path(__file__).resolve().parents[1]


def closed_loop(clients: int, seconds: float, send: Callable[[Any, int], int]) -> dict[str, Any]:
    """`clients` threads, each with its own HTTP connection, call send(client, i) back to back for `seconds` (i
    counts on from k * 997 in thread k, so threads start at different inputs); send returns how many items its
    request answered, 0 for a failed request."""
    import httpx2 as httpx

    conns = [httpx.Client(timeout=120) for _ in range(clients)]
    try:
        run = drive(lambda k, i, first: send(conns[k], i), clients, counting(lambda k: k * 997), seconds=seconds,
                    errors="record")
    finally:
        for conn in conns:
            conn.close()
    served = [r for r in run.records if r.output]
    lat = [r.latency for r in served]
    return {"items_per_s": sum(r.output for r in served) / run.wall, "requests": len(lat),
            "failed": len(run.records) - len(served), "p50_ms": 1000 * percentile(lat, 50),
            "p90_ms": 1000 * percentile(lat, 90), "wall_s": run.wall}


def options(block: str, rounds: int, seconds: float) -> Callable[[argparse.ArgumentParser], None]:
    def add(p: argparse.ArgumentParser) -> None:
        p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / f"{block.replace('-', '_')}.json")
        p.add_argument("--rounds", type=int, default=rounds)
        p.add_argument("--seconds", type=float, default=seconds)
        p.add_argument("--docs", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
        p.add_argument("--render-only", action="store_true")
    return add


def cli(block: str, run: Callable[[argparse.Namespace], dict[str, Any]],
        render: Callable[[dict[str, Any]], list[str]]) -> Callable[[argparse.Namespace], int]:
    def main(a: argparse.Namespace) -> int:
        for noisy in ("httpx", "httpx2"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        if a.render_only:
            lines = publish(read_json(a.out), None, a.docs, block, render)
        else:
            lines = publish(run(a), a.out, a.docs, block, render, indent=1)
        print("\n".join(lines))
        return 0
    return main
