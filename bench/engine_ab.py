"""The generation engine of this tree against the one of another checkout, in one interleaved A/B run.

    python -m bench engine_ab --base-root /path/to/other/checkout [--rounds 3] [--out bench/results/engine_ab.json]

Both servers serve the same in-place package (bench.generation's 124M-shaped GPT-2, random weights) with the
benchmark's settings (2 threads, 32 slots, spinning on one shared pool). Each round runs, for each side in
alternating order, the streams piece (1 / 8 / 32 concurrent streams, 32-token prompts, 128 new tokens, greedy,
ignore_eos; aggregate tokens/s and time-to-first-token p50) and the arrival piece (4 streams decoding when a
900-token prompt arrives: the largest gap they see, their median inter-token latency, the long prompt's time to
first token). One server runs at a time, so neither side's idle threads share the cores with the other.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import subprocess
from pathlib import Path
from typing import Any

from testing.launch import ServerProcess

from .generation import Config, OrtserveStreams, arrival_once, material, prompts, run_streams
from bench.harness import Benchmark
from bench.results import write_json

log = logging.getLogger("bench.engine_ab")
ROOT = Path(__file__).resolve().parents[1]
LEVELS = (1, 8, 32)


def serve(repo: Path, cfg: Config, root: Path) -> ServerProcess:
    return ServerProcess(repo, ["--intra-op-threads", str(cfg.threads), "--max-sequences", "32",
                                "--intra-op-spinning", cfg.spinning], root=root)


def one_side(repo: Path, cfg: Config, root: Path, pool: list[int], tok, salt: int,
             levels: tuple[int, ...] = LEVELS) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with serve(repo, cfg, root) as server:
        client = OrtserveStreams(server.address, "gpt")
        try:
            run_streams(client, prompts(pool, 2, cfg.prompt_tokens, salt - 1), 8, tok)   # warm
            for n in levels:
                wall, recs = run_streams(client, prompts(pool, n, cfg.prompt_tokens, salt + n), cfg.new_tokens, tok)
                out[f"streams_{n}"] = {"tokens_per_s": sum(r.tokens for r in recs) / wall,
                                       "ttft_p50_ms": 1000 * statistics.median(r.ttft for r in recs)}
            out["arrival"] = arrival_once(client, pool, cfg, tok, salt + 100)
        finally:
            client.close()
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """metric -> field -> the values of every round."""
    table: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        for metric, fields in run.items():
            for name, value in fields.items():
                table.setdefault(metric, {}).setdefault(name, []).append(round(float(value), 2))
    return table


def render(result: dict[str, Any]) -> str:
    lines = ["| piece | figure | this tree (median, min-max) | base (median, min-max) | ratio of medians |",
             "|---|---|---|---|---|"]
    new, base = result["sides"]["this"], result["sides"]["base"]
    for metric, fields in new.items():
        for name, values in fields.items():
            other = base[metric][name]
            m, b = statistics.median(values), statistics.median(other)
            lines.append(f"| {metric} | {name} | {m:.1f} ({min(values):.1f}-{max(values):.1f}) | "
                         f"{b:.1f} ({min(other):.1f}-{max(other):.1f}) | {m / b:.3f} |")
    return "\n".join(lines)


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--base-root", type=Path, required=True, help="the other checkout (e.g. a git worktree)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 and 4 streams, 32 new tokens")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "engine_ab.json")


def cli(args: argparse.Namespace) -> int | None:
    cfg = Config.quick() if args.quick else Config()
    levels = (1, 4) if args.quick else LEVELS
    _, repo, pool = material(cfg)
    from tokenizers import Tokenizer

    from .material import bpe_tokenizer_dir
    tok = Tokenizer.from_file(str(bpe_tokenizer_dir(cfg.work) / "tokenizer.json"))
    # Only the in-place package: the repository also holds a concat one, which one of the engines no longer serves.
    # (hard links: the repository refuses a model directory that resolves outside it)
    ab_repo = cfg.work / "repository-ab"
    if not (ab_repo / "gpt").exists():
        shutil.copytree(repo / "gpt", ab_repo / "gpt", copy_function=os.link)
    sides = {"this": ROOT, "base": args.base_root.resolve()}
    runs: dict[str, list[dict[str, Any]]] = {"this": [], "base": []}
    for r in range(args.rounds):
        order = ["this", "base"] if r % 2 == 0 else ["base", "this"]
        for side in order:
            log.info("round %d: %s (%s)", r + 1, side, sides[side])
            runs[side].append(one_side(ab_repo, cfg, sides[side], pool, tok, salt=1000 * r, levels=levels))
    commits = {side: subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True).stdout.strip() for side, root in sides.items()}
    result = {"commits": commits, "rounds": args.rounds, "threads": cfg.threads, "spinning": cfg.spinning,
              "sides": {side: summarize(v) for side, v in runs.items()}}
    write_json(args.out, result)
    print(f"this tree {commits['this']} vs base {commits['base']}, {args.rounds} interleaved rounds")
    print(render(result))


BENCHMARK = Benchmark(summary=__doc__, sides=("ortserve", "ortserve-base"), pieces=(), options=options, run=cli)
