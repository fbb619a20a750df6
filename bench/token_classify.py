"""Token classification served (gRPC task API) vs transformers' token-classification pipeline in-process.

    python -m bench token_classify --out bench/results/token_classify.json [--rounds 3] [--seconds 6]
    python -m bench token_classify --render-only --out bench/results/token_classify.json

Material (bench/results/token-classify-work/): the punctuation and casing restorer the main command publishes
(`python -m training token-classify --init minilm`: MiniLM fine-tuned on the corpus's own marks and capitals, trained
here once), exported by `python -m export --task token-classify --variants fp32,optimized,int8` (parity-gated; the
server runs the package's CPU default, int8 when the gate passed it, else optimized). A trained model, not a random
head: the int8 gate judges top-1 agreement with fp32, which a head with no margins cannot keep. The pipeline loads
the same checkpoint directory (torch, both cores: torch's default threads) with aggregation_strategy "simple", the
batch given as `batch_size`; ortserve answers the same texts, the same aggregation, over gRPC from one client thread
sending batches of the same size. Shakespeare passages of 12-40 words, lowercased without punctuation (the
restorer's input). Sides alternate round by round; ratios of the medians. Before timing, both sides' entities for
the same texts are compared (labels and offsets; the largest score difference is reported beside them).

Beside the two served sides, the same rounds time each side's forward pass alone on the same padded batches, in the
benchmark's process while the server idles: the server's graph in an onnxruntime session with the server's options
(spinning, onnxruntime's default threads) and the checkpoint's torch model under inference_mode. Graph texts/s over
pipeline texts/s is the most any serving of this graph could reach (no tokenizer, aggregation or door at all).
"""
from __future__ import annotations

import json
import logging
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench import piece_cli
from bench.harness import Benchmark
from bench.results import header, stamp
from bench.material import passages
from testing.closedloop import counting, drive
from testing.launch import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "bench" / "results" / "token-classify-work"
MODEL = "punctuate"
BATCHES = (1, 8)
log = logging.getLogger("bench.token_classify")


def checkpoint(work: Path) -> Path:
    """The punctuation restorer, trained once by the main command's recipe (~3 minutes on 2 quiet cores)."""
    out = work / "punctuate-checkpoint"
    if not (out / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "training", "token-classify", "--init", "minilm", "--quiet",
                        "--out", str(out)], check=True, cwd=ROOT)
    return out


def repository(work: Path, ckpt: Path) -> Path:
    repo = work / "repository"
    if not (repo / MODEL / "1" / "model.json").is_file():
        subprocess.run([sys.executable, "-m", "export", str(ckpt), "--task", "token-classify", "--repository",
                        str(repo), "--name", MODEL, "--version", "1", "--variants", "fp32,optimized,int8"], check=True,
                       cwd=ROOT)
    return repo


def forward_passes(repo: Path, ckpt: Path, model_name: str = MODEL, auto: str = "AutoModelForTokenClassification"):
    """(graph, torch, variant): one forward pass of a batch of texts, tokenized and padded as the server pads them,
    through the package's CPU-default graph and through transformers' `auto` class (also bench/classify_pipeline.py)."""
    import onnxruntime as ort
    import torch
    import transformers
    from tokenizers import Tokenizer

    package = repo / model_name / "1"
    manifest = json.loads((package / "model.json").read_text())
    graph_file = manifest["variants"][manifest["default_variant"]["cpu"]]   # what the server runs
    tok = Tokenizer.from_file(str(package / "tokenizer.json"))
    tok.enable_padding(pad_id=tok.token_to_id("[PAD]") or 0)
    tok.enable_truncation(512)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    session = ort.InferenceSession(str(package / graph_file), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    model = getattr(transformers, auto).from_pretrained(ckpt).eval()

    def feeds(batch: list[str]) -> dict[str, np.ndarray]:
        enc = tok.encode_batch(batch)
        ids = np.array([e.ids for e in enc], np.int64)
        out = {"input_ids": ids, "attention_mask": np.array([e.attention_mask for e in enc], np.int64),
               "token_type_ids": np.zeros_like(ids)}
        return {k: v for k, v in out.items() if k in names}

    def graph(batch: list[str]) -> None:
        session.run(None, feeds(batch))

    def forward(batch: list[str]) -> None:
        with torch.inference_mode():
            model(**{k: torch.from_numpy(v) for k, v in feeds(batch).items()})
    return graph, forward, manifest["default_variant"]["cpu"]


def served_vs_pipeline(runs: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, Any]]:
    """Per batch size: each side's median texts/s over rounds, served / pipeline, and graph alone / pipeline (the
    ceiling); also bench/classify_pipeline.py's."""
    cells = {}
    for size, sides in runs.items():
        med = {k: statistics.median(v) for k, v in sides.items()}
        cells[size] = {"runs": sides, "median": med, "ratio": med["ortserve"] / med["pipeline"],
                       "ceiling": med["graph"] / med["pipeline"]}
    return cells


def _entities(items: list[dict]) -> list[tuple[str, int, int, float]]:
    return [(e["entity_group"], e["start"], e["end"], e["score"]) for e in items]


def run(rounds: int, seconds: float, command: str) -> dict[str, Any]:
    import torch
    import transformers

    from clients import OrtserveClient

    WORK.mkdir(parents=True, exist_ok=True)
    ckpt = checkpoint(WORK)
    repo = repository(WORK, ckpt)
    from training.punctuation import bare_text

    texts = [bare_text(t) for t in passages(200, 12, seed=21) + passages(200, 40, seed=22)]
    pipe = transformers.pipeline("token-classification", model=str(ckpt), aggregation_strategy="simple",
                                 device="cpu")
    with ServerProcess(repo, ["--intra-op-spinning", "on"], startup_timeout=180) as server, \
            OrtserveClient(server.address, timeout=120) as client:
        def served(batch: list[str]) -> list[list[tuple[str, int, int, float]]]:
            got = client.token_classify(batch, MODEL, aggregation_strategy="simple")
            return [[(e.label, e.start, e.end, e.score) for e in row] for row in got]

        def local(batch: list[str], size: int) -> list[list[tuple[str, int, int, float]]]:
            out = pipe(batch, batch_size=size)
            return [_entities(row) for row in out]

        sample = texts[:16]
        a, b = served(sample), local(sample, 8)
        # Labels and offsets; scores are compared apart (int8 moves them by more than float rounding).
        same = sum(len(x) == len(y) and all(p[:3] == q[:3] for p, q in zip(x, y)) for x, y in zip(a, b))
        score_diff = max((float(abs(p[3] - q[3])) for x, y in zip(a, b) if len(x) == len(y) for p, q in zip(x, y)
                          if p[:3] == q[:3]), default=0.0)
        log.info("entities agree on %d of %d texts (scores within %.4f)", same, len(sample), score_diff)

        def closed_loop(fn, size: int) -> float:
            run = drive(lambda c, k, first: fn([texts[(k * size + j) % len(texts)] for j in range(size)]), 1,
                        counting(), seconds=seconds)
            return len(run.records) * size / run.wall

        graph, forward, variant = forward_passes(repo, ckpt)
        for size in BATCHES:          # warm every side
            closed_loop(served, size)
            closed_loop(lambda x, s=size: local(x, s), size)
            closed_loop(graph, size)
            closed_loop(forward, size)
        runs: dict[str, dict[str, list[float]]] = {
            str(s): {"ortserve": [], "pipeline": [], "graph": [], "torch_forward": []} for s in BATCHES}
        for r in range(rounds):
            for size in BATCHES:
                sides = [("ortserve", served), ("pipeline", lambda x, s=size: local(x, s)), ("graph", graph),
                         ("torch_forward", forward)]
                for name, fn in (sides if r % 2 == 0 else sides[::-1]):
                    runs[str(size)][name].append(closed_loop(fn, size))
                    log.info("round %d batch %d %s: %.1f texts/s", r + 1, size, name, runs[str(size)][name][-1])
    cells = served_vs_pipeline(runs)
    return {**stamp(command),
            "agree": [same, len(sample)], "score_diff": score_diff, "variant": variant, "cells": cells,
            "rounds": rounds, "seconds": seconds, "torch_threads": torch.get_num_threads()}


def render(result: dict[str, Any]) -> list[str]:
    lines = ["## Token classification: served vs the transformers pipeline (bench/token_classify.py)", "",
             header(result),
             "- ortserve: `python -m server --intra-op-spinning on` (onnxruntime's default intra-op threads = the "
             "cores, spinning as on a machine of its own; encoder batching on), one gRPC client thread sending "
             "`TokenClassify` with the batch's texts, aggregation_strategy simple",
             "- transformers pipeline: `pipeline(\"token-classification\", aggregation_strategy=\"simple\")` "
             f"in-process, torch {result['torch_threads']} threads, `batch_size` = the batch",
             "- Model: the punctuation and casing restorer (MiniLM fine-tuned by `python -m training token-classify "
             "--init minilm`), exported with fp32, optimized and int8; the server runs its CPU default, "
             f"**{result.get('variant', 'optimized')}**. Entities (labels and offsets) agree on {result['agree'][0]} "
             f"of {result['agree'][1]} texts; scores of agreeing entities within "
             f"{result.get('score_diff', 1e-3):.4f}.",
             "- Forward passes alone (same rounds, same batches, in the benchmark's process while the server idles): "
             "the server's graph in onnxruntime (spinning, default threads) and the checkpoint's torch model "
             "(inference_mode). 'Ceiling' = graph alone / pipeline: the most any serving of this graph could reach.",
             f"- {result['rounds']} rounds of {result['seconds']:.0f} s per batch size and side, medians.", "",
             "| texts per request | ortserve texts/s | pipeline texts/s | ratio | goal (batch 8) ≥ 2× | "
             "graph alone texts/s | torch forward alone texts/s | ceiling |",
             "|---|---|---|---|---|---|---|---|"]
    for size, cell in result["cells"].items():
        goal = ("met" if cell["ratio"] >= 2 else "**missed**") if size == "8" else "—"
        med = cell["median"]
        alone = (f" {med['graph']:,.1f} | {med['torch_forward']:,.1f} | {cell['ceiling']:.2f} |" if "graph" in med
                 else " - | - | - |")
        lines.append(f"| {size} | {med['ortserve']:,.1f} | {med['pipeline']:,.1f} | {cell['ratio']:.2f} | {goal} |"
                     + alone)
    return lines


BENCHMARK = Benchmark(summary=__doc__, sides=("ortserve", "transformers-pipeline"), options=piece_cli.options("token-classify", rounds=3, seconds=6.0),
                      run=piece_cli.cli("token-classify", lambda a: run(a.rounds, a.seconds, a.invocation), render))
