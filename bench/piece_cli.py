"""The command line the peer benchmarks share (bench.embeddings, bench.token_classify, bench.ray_proxy): run (or with
--render-only re-read) a result JSON, write it whole (temp, then rename), and render it into its marked block of
docs/BENCHMARKS.md (bench/blocks.py).

    main(__doc__, "embeddings", lambda a: run(...), render, rounds=3, seconds=6.0)
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.blocks import write_block
from bench.machine import describe
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
        run = drive(lambda k, i, first: send(conns[k], i), clients, counting(lambda k: k * 997), seconds=seconds)
    finally:
        for conn in conns:
            conn.close()
    served = [r for r in run.records if r.output]
    lat = [r.latency for r in served]
    return {"items_per_s": sum(r.output for r in served) / run.wall, "requests": len(lat),
            "failed": len(run.records) - len(served), "p50_ms": 1000 * percentile(lat, 50),
            "p90_ms": 1000 * percentile(lat, 90), "wall_s": run.wall}


def stamp(command: str) -> dict[str, Any]:
    """What every result records: the machine, the command and when it ran."""
    return {"machine": describe(ROOT), "command": command, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def header(result: dict[str, Any]) -> str:
    m = result["machine"]
    return (f"- Command: `{result['command']}` at {result['at']}; {m['cpu_model']}, {m['nproc']} cores, commit "
            f"{m['git_commit']}, load average at start {m['loadavg_at_start']}")


def main(doc: str, block: str, run: Callable[[argparse.Namespace], dict[str, Any]],
         render: Callable[[dict[str, Any]], list[str]], rounds: int, seconds: float) -> None:
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / f"{block.replace('-', '_')}.json")
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--seconds", type=float, default=seconds)
    p.add_argument("--docs", type=Path, default=ROOT / "docs" / "BENCHMARKS.md")
    p.add_argument("--render-only", action="store_true")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if a.render_only:
        result = json.loads(a.out.read_text())
    else:
        result = run(a)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = a.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        os.replace(tmp, a.out)
    write_block(a.docs, block, render(result))
    print("\n".join(render(result)))
