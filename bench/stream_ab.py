"""Single-stream decoding served over gRPC, several trees or server flags interleaved (and genai in-process).

    python -m bench stream_ab --side base=/path/to/other/checkout --side this=. \\
        --side si4=.:--stream-interval=4 [--genai] [--engine] [--rounds 3] [--per-round 2] [--new-tokens 256]

Each side is NAME=ROOT[:FLAG=VALUE,...] (server flags added to the benchmark's: 2 threads, spinning, the w4 variant of
bench.generation's trained 124M Llama). Per stream: tokens/s (first request to last token, as bench.generation),
and CPU per token from /proc: the server's event-loop thread (the doors, output processing, the engine's own
Python) and this client process (the sync gRPC stub receiving the messages). `--genai` and `--engine` add two sides
without a door, each a process of its own per stream: onnxruntime-genai and ortserve's engine as a library, on the
same graph with the same 2 spinning threads. CPU per token is steadier than
tokens/s on a shared machine, and says where serving spends; the 1-minute load is printed with every round.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

from testing.launch import ServerProcess

from .generation import GENAI_VENV, HERE, Config, OrtserveStreams, material, prompts, run_streams
from .material import bpe_tokenizer_dir
from bench.harness import Benchmark

log = logging.getLogger("bench.stream_ab")
TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int, tid: int) -> float:
    fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def parse_side(spec: str) -> tuple[str, Path, list[str]]:
    name, _, rest = spec.partition("=")
    root, _, flags = rest.partition(":")
    if not name or not root:
        raise argparse.ArgumentTypeError(f"--side: NAME=ROOT[:FLAG=VALUE,...], got {spec!r}")
    args = [part for flag in flags.split(",") if flag for part in flag.split("=", 1)]
    return name, Path(root).resolve(), args


def one_side(repo: Path, root: Path, flags: list[str], pool: list[int], tok, salt: int, per: int,
             new_tokens: int) -> list[dict[str, float]]:
    args = ["--intra-op-threads", "2", "--max-sequences", "32", "--intra-op-spinning", "on", "--variant", "w4", *flags]
    rows = []
    with ServerProcess(repo, args, root=root) as server:
        client = OrtserveStreams(server.address, "gpt")
        try:
            run_streams(client, prompts(pool, 1, 32, salt - 1), new_tokens, tok)     # warm, as the in-process sides
            for i in range(per):
                loop0, own0 = thread_cpu_s(server.pid, server.pid), own_cpu_s()
                wall, recs = run_streams(client, prompts(pool, 1, 32, salt + i), new_tokens, tok)
                n = sum(r.tokens for r in recs)
                rows.append({"tokens_per_s": n / wall,
                             "loop_ms_per_token": 1e3 * (thread_cpu_s(server.pid, server.pid) - loop0) / n,
                             "client_ms_per_token": 1e3 * (own_cpu_s() - own0) / n, "load": load()})
        finally:
            client.close()
    return rows


def in_process_side(command: list[str], repo: Path, pool: list[int], salt: int, per: int,
                    new_tokens: int) -> list[dict[str, float]]:
    """`command` PACKAGE PROMPTS NEW_TOKENS THREADS VARIANT, once per stream (genai_run.py, engine_run.py)."""
    rows = []
    for i in range(per):
        out = subprocess.run([*command, str(repo / "gpt" / "1"), json.dumps(prompts(pool, 1, 32, salt + i)),
                              str(new_tokens), "2", "w4"], capture_output=True, text=True, check=True, cwd=HERE.parent)
        rows.append({"tokens_per_s": json.loads(out.stdout.strip().splitlines()[-1])["tokens_per_s"], "load": load()})
    return rows


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--side", type=parse_side, action="append", required=True)
    ap.add_argument("--genai", action="store_true", help="onnxruntime-genai in-process each round (bench/.venv-genai)")
    ap.add_argument("--engine", action="store_true",
                    help="ortserve's engine in-process each round (bench/engine_run.py: no door, no client, "
                         "like genai)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-round", type=int, default=2, help="streams per side and round")
    ap.add_argument("--new-tokens", type=int, default=256)


def cli(args: argparse.Namespace) -> int | None:
    _, repo, pool = material(Config(model="llama", variant="w4", extra_variants=("w4",)))
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(bpe_tokenizer_dir(Config().work) / "tokenizer.json"))
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in args.side}
    in_process = {}
    if args.engine:
        in_process["engine"] = [sys.executable, "-m", "bench.engine_run"]
    if args.genai:
        in_process["genai"] = [str(GENAI_VENV / "bin" / "python"), str(HERE / "genai_run.py")]
    results.update({name: [] for name in in_process})
    for r in range(args.rounds):
        order = args.side if r % 2 == 0 else args.side[::-1]
        for name, root, flags in order:
            rows = one_side(repo, root, flags, pool, tok, 100 * r + 1, args.per_round, args.new_tokens)
            results[name] += rows
            log.info("round %d %s: %s tok/s, load %.1f", r + 1, name, [round(x["tokens_per_s"]) for x in rows],
                     rows[-1]["load"])
        for name, command in (in_process.items() if r % 2 == 0 else list(in_process.items())[::-1]):
            rows = in_process_side(command, repo, pool, 100 * r + 1, args.per_round, args.new_tokens)
            results[name] += rows
            log.info("round %d %s: %s tok/s", r + 1, name, [round(x["tokens_per_s"]) for x in rows])
    print("| side | tok/s median (min-max) | loop thread ms/token | client ms/token | vs genai | load |")
    print("|---|---|---|---|---|---|")
    genai = statistics.median(x["tokens_per_s"] for x in results["genai"]) if args.genai else None
    for name, rows in results.items():
        tps = [x["tokens_per_s"] for x in rows]
        cpu = [f"{statistics.median(x[k] for x in rows):.3f}" if k in rows[0] else "-"
               for k in ("loop_ms_per_token", "client_ms_per_token")]
        ratio = f"{statistics.median(tps) / genai:.2f}" if genai else "-"
        print(f"| {name} | {statistics.median(tps):.1f} ({min(tps):.0f}-{max(tps):.0f}) | {cpu[0]} | {cpu[1]} | {ratio} "
              f"| {min(x['load'] for x in rows):.1f}-{max(x['load'] for x in rows):.1f} |")


BENCHMARK = Benchmark(summary=__doc__, sides=("ortserve", "genai"), pieces=(), options=options, run=cli)
