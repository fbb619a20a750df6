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
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.blocks import write_block
from bench.machine import describe
from bench.stats import percentile

ROOT = Path(__file__).resolve().parents[1]


def closed_loop(clients: int, seconds: float, send: Callable[[Any, int], int]) -> dict[str, Any]:
    """`clients` threads, each with its own HTTP connection, call send(client, i) back to back for `seconds` (i
    counts on from k * 997 in thread k, so threads start at different inputs); send returns how many items its
    request answered, 0 for a failed request."""
    import httpx2 as httpx

    lat: list[float] = []
    items, failed = [0], [0]
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def worker(k: int) -> None:
        with httpx.Client(timeout=120) as client:
            i = k * 997
            while time.perf_counter() < stop_at:
                t = time.perf_counter()
                n = send(client, i)
                dt = time.perf_counter() - t
                i += 1
                with lock:
                    if n:
                        lat.append(dt)
                        items[0] += n
                    else:
                        failed[0] += 1
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"items_per_s": items[0] / wall, "requests": len(lat), "failed": failed[0],
            "p50_ms": 1000 * percentile(lat, 50), "p90_ms": 1000 * percentile(lat, 90), "wall_s": wall}


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
