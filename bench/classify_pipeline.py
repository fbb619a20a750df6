"""Sequence classification served (gRPC task API) vs transformers' text-classification pipeline in-process, on a
DeBERTa-v3-base-shaped classifier.

    python -m bench classify_pipeline --out bench/results/classify_pipeline.json [--rounds 3] [--seconds 6]
    python -m bench classify_pipeline --render-only --out bench/results/classify_pipeline.json

Material (bench/results/classify-work/): a random DebertaV2ForSequenceClassification of DeBERTa-v3-base's shape built
with transformers (bench/base_models.py "deberta-v3"), exported by `python -m export --task classify` with its default
variants (parity-gated; the server runs the package's CPU default). The pipeline loads the same checkpoint folder
(torch, torch's default threads = the cores) and gets the batch as `batch_size`; ortserve answers the same texts from
one gRPC client thread sending `Classify` requests of the same size. Shakespeare passages of 12-40 words. Sides
alternate round by round; ratios of the medians. Before timing, both sides' labels and scores for the same texts are
compared.

Beside the two served sides the same rounds time each side's forward pass alone on the same padded batches, in the
benchmark's process while the server idles (bench/token_classify.py's `forward_passes`): the server's graph in an
onnxruntime session with the server's options and the checkpoint's torch model under inference_mode. Graph texts/s
over pipeline texts/s is the most any serving of this graph could reach.
"""
from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from bench import piece_cli
from bench.harness import Benchmark
from bench.material import passages
from bench.results import header, stamp
from testing.closedloop import counting, drive
from testing.launch import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "bench" / "results" / "classify-work"
MODEL = "deberta-v3"
BATCHES = (1, 8)
GOAL = 1.5           # at batch 8 (issue 38)
log = logging.getLogger("bench.classify_pipeline")


def repository(work: Path, ckpt: Path) -> Path:
    repo = work / "repository"
    if not (repo / MODEL / "1" / "model.json").is_file():
        subprocess.run([sys.executable, "-m", "export", str(ckpt), "--task", "classify", "--repository", str(repo),
                        "--name", MODEL, "--version", "1"], check=True, cwd=ROOT)
    return repo


def _texts_per_s(fn: Callable[[list[str]], Any], texts: list[str], size: int, seconds: float) -> float:
    run = drive(lambda c, k, first: fn([texts[(k * size + j) % len(texts)] for j in range(size)]), 1, counting(),
                seconds=seconds)
    return len(run.records) * size / run.wall


def run(rounds: int, seconds: float, command: str) -> dict[str, Any]:
    import torch
    import transformers

    from bench.base_models import checkpoint
    from bench.token_classify import forward_passes, served_vs_pipeline
    from clients import OrtserveClient

    WORK.mkdir(parents=True, exist_ok=True)
    ckpt = checkpoint(WORK, MODEL)
    repo = repository(WORK, ckpt)
    texts = passages(200, 12, seed=21) + passages(200, 40, seed=22)
    pipe = transformers.pipeline("text-classification", model=str(ckpt), device="cpu")
    with ServerProcess(repo, ["--intra-op-spinning", "on"], startup_timeout=180) as server, \
            OrtserveClient(server.address, timeout=300) as client:
        def served(batch: list[str]) -> list[tuple[str, float]]:
            return [(c.label, c.score) for c in client.classify(batch, MODEL)]

        def local(batch: list[str], size: int) -> list[tuple[str, float]]:
            return [(r["label"], r["score"]) for r in pipe(batch, batch_size=size)]

        sample = texts[:16]
        a, b = served(sample), local(sample, 8)
        same = sum(x[0] == y[0] for x, y in zip(a, b))
        score_diff = max(abs(x[1] - y[1]) for x, y in zip(a, b) if x[0] == y[0]) if same else float("nan")
        log.info("labels agree on %d of %d texts (scores within %.2e)", same, len(sample), score_diff)
        graph, forward, variant = forward_passes(repo, ckpt, MODEL, "AutoModelForSequenceClassification")
        sides: dict[int, list[tuple[str, Callable[[list[str]], Any]]]] = {
            size: [("ortserve", served), ("pipeline", lambda x, s=size: local(x, s)), ("graph", graph),
                   ("torch_forward", forward)] for size in BATCHES}
        for size in BATCHES:          # warm every side
            for _, fn in sides[size]:
                _texts_per_s(fn, texts, size, min(seconds, 3.0))
        runs: dict[str, dict[str, list[float]]] = {str(s): {name: [] for name, _ in sides[s]} for s in BATCHES}
        for r in range(rounds):
            for size in BATCHES:
                for name, fn in (sides[size] if r % 2 == 0 else sides[size][::-1]):
                    runs[str(size)][name].append(_texts_per_s(fn, texts, size, seconds))
                    log.info("round %d batch %d %s: %.2f texts/s", r + 1, size, name, runs[str(size)][name][-1])
    return {**stamp(command), "agree": [same, len(sample)], "score_diff": score_diff, "variant": variant,
            "cells": served_vs_pipeline(runs), "rounds": rounds, "seconds": seconds, "torch_threads": torch.get_num_threads(),
            "hf_attention": getattr(pipe.model.config, "_attn_implementation", None)}


def render(result: dict[str, Any]) -> list[str]:
    from bench.base_models import SHAPES

    lines = ["## Sequence classification: served vs the transformers pipeline, DeBERTa-v3 base shape "
             "(bench/classify_pipeline.py)", "",
             header(result),
             "- ortserve: `python -m server --intra-op-spinning on` (onnxruntime's default intra-op threads = the "
             "cores, spinning as on a machine of its own; encoder batching on), one gRPC client thread sending "
             "`Classify` with the batch's texts",
             "- transformers pipeline: `pipeline(\"text-classification\")` in-process, torch "
             f"{result['torch_threads']} threads (its default), attention {result.get('hf_attention')}, "
             "`batch_size` = the batch",
             f"- Model: {SHAPES[MODEL]}; exported by `python -m export --task classify`; the server runs its CPU "
             f"default, **{result['variant']}**. Labels agree on {result['agree'][0]} of {result['agree'][1]} texts; "
             f"scores of agreeing labels within {result['score_diff']:.1e}.",
             "- Forward passes alone (same rounds, same batches, in the benchmark's process while the server idles): "
             "the server's graph in onnxruntime (spinning, default threads) and the checkpoint's torch model "
             "(inference_mode). 'Ceiling' = graph alone / pipeline: the most any serving of this graph could reach.",
             f"- {result['rounds']} rounds of {result['seconds']:.0f} s per batch size and side, Shakespeare passages "
             "of 12-40 words, medians.", "",
             f"| texts per request | ortserve texts/s | pipeline texts/s | ratio | goal (batch 8) ≥ {GOAL}× | "
             "graph alone texts/s | torch forward alone texts/s | ceiling |",
             "|---|---|---|---|---|---|---|---|"]
    for size, cell in result["cells"].items():
        goal = ("met" if cell["ratio"] >= GOAL else "**missed**") if size == "8" else "—"
        med = cell["median"]
        lines.append(f"| {size} | {med['ortserve']:,.2f} | {med['pipeline']:,.2f} | {cell['ratio']:.2f} | {goal} | "
                     f"{med['graph']:,.2f} | {med['torch_forward']:,.2f} | {cell['ceiling']:.2f} |")
    return lines


BENCHMARK = Benchmark(summary=__doc__, sides=("ortserve", "transformers-pipeline"),
                      options=piece_cli.options("classify-pipeline", rounds=3, seconds=6.0),
                      run=piece_cli.cli("classify-pipeline", lambda a: run(a.rounds, a.seconds, a.invocation), render))
