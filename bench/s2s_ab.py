"""Served seq2seq (g2p by default) at many clients, several trees or server flags interleaved: what a change to the served path gives.

    python -m bench s2s_ab --side base=/path/to/other/checkout --side this=. [--side t2=.:--intra-op-threads=2] \\
        [--model g2p|marian] [--clients 32] [--requests 1024] [--rounds 6] [--checkpoint G2P_DIR] [--work DIR]

Each side is NAME=ROOT[:FLAG=VALUE,...] (server flags added to bench seq2seq's served ones: fp32, one onnxruntime
thread, 32 slots). Every side's server runs the whole time (one at a time is busy); the rounds take the sides in
turn, the order reversed every round. Server and load are bench seq2seq's served piece's (OrtserveServed: closed
loop, the asyncio client, a coroutine per client), the answer delivered as the peers deliver theirs (the first
token, the rest with the end).
Per round and side: tokens/s (without the eos, as bench seq2seq counts), and CPU per request from /proc: the server
process and this client process. The 1-minute load is printed with every round.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import time
from pathlib import Path

from .s2s_material import build
from .seq2seq import Config, OrtserveServed, sources
from .stream_ab import TICK, load, own_cpu_s, parse_side
from bench.harness import Benchmark

log = logging.getLogger("bench.s2s_ab")


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--side", type=parse_side, action="append", required=True)
    ap.add_argument("--model", choices=("g2p", "marian"), default="g2p", help="which of bench seq2seq's models")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--checkpoint", type=Path, default=None, help="the g2p checkpoint (default: bench seq2seq's)")
    ap.add_argument("--work", type=Path, default=None, help="bench seq2seq's work folder (packages, conversions)")


def cli(args: argparse.Namespace) -> int | None:
    cfg = Config(models=(args.model,), pieces=("served",), **({"work": args.work} if args.work else {}))
    model = build(cfg.work, (args.model,), args.checkpoint, cfg.threads)[args.model]
    texts = sources(model, max(args.requests, 256)).texts[:args.requests]
    servers = {name: OrtserveServed(model, cfg, 1, root, tuple(extra)) for name, root, extra in args.side}
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
    try:
        for server in servers.values():      # untimed: every batch shape once
            server.serve("answer", args.clients, texts[:256])
        for r in range(args.rounds):
            for name in (list(servers) if r % 2 == 0 else list(servers)[::-1]):
                time.sleep(0.5)
                server = servers[name]
                cpu0, own0 = process_cpu_s(server.server.pid), own_cpu_s()
                wall, records = server.serve("answer", args.clients, texts)
                n = len(records)
                rows[name].append({"tokens_per_s": sum(len(x.output) for x in records) / wall,
                                   "server_ms_per_request": 1e3 * (process_cpu_s(server.server.pid) - cpu0) / n,
                                   "client_ms_per_request": 1e3 * (own_cpu_s() - own0) / n, "load": load()})
                log.info("round %d %s: %.0f tok/s, load %.1f", r + 1, name, rows[name][-1]["tokens_per_s"],
                         rows[name][-1]["load"])
    finally:
        for server in servers.values():
            server.close()
    first = statistics.median(x["tokens_per_s"] for x in rows[args.side[0][0]])
    print(f"| side | tok/s median (min-max) | server ms/request | client ms/request | vs {args.side[0][0]} | load |")
    print("|---|---|---|---|---|---|")
    for name, side in rows.items():
        tps = [x["tokens_per_s"] for x in side]
        server_ms = statistics.median(x["server_ms_per_request"] for x in side)
        client_ms = statistics.median(x["client_ms_per_request"] for x in side)
        print(f"| {name} | {statistics.median(tps):.0f} ({min(tps):.0f}-{max(tps):.0f}) | {server_ms:.3f} | "
              f"{client_ms:.3f} | {statistics.median(tps) / first:.3f} | "
              f"{min(x['load'] for x in side):.1f}-{max(x['load'] for x in side):.1f} |")
    return None


BENCHMARK = Benchmark(summary=__doc__, sides=("ortserve",), pieces=(), options=options, run=cli)
