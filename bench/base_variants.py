"""The base-shaped encoders' graphs in-process: fp32 against int8 (and, for XLM-R, onnxruntime's fused attention),
opened as the server opens them, at batch 8 of short and long passages.

    python -m bench base_variants --model xlmr|modernbert|deberta-v3 [--rounds 7] [--fused]

Material: the packages bench/embeddings.py (xlmr, modernbert: `--task embed --variants fp32,int8`) and
bench/classify_pipeline.py (deberta-v3: `--task classify --variants fp32,int8`) export, built on first use
(bench/base_models.py). `--fused` adds `optimize_model(model_type="bert")` of the fp32 graph as
export/variants.py's `optimized` variant builds it (Attention, BiasGelu; residual + LayerNorm left unfused), for
the families whose attention it matches (XLM-R).

Each graph: an onnxruntime session with the server's options (all graph optimisations, SkipLayerNormFusion off,
the default intra-op threads, spinning on as the benchmarks' servers run); feeds padded as the server pads them.
Timing: rounds in which every graph runs the same batch 3 times, the graphs taking turns (reversed every other
round) so a shared machine's load drifts fall on all alike; the median of each graph's per-batch times. Accuracy
against fp32 on 64 short and 64 long passages in batches of 8: embeddings by cosine (smallest, mean), classifiers
by top-1 label agreement.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from bench.harness import Benchmark
from bench.material import passages

log = logging.getLogger("bench.base_variants")
BATCH = 8


def package_dir(model: str) -> Path:
    """The model's published package (exported once, as its served benchmark does)."""
    if model == "deberta-v3":
        from bench import classify_pipeline
        from bench.base_models import checkpoint

        repo = classify_pipeline.repository(classify_pipeline.WORK,
                                            checkpoint(classify_pipeline.WORK, classify_pipeline.MODEL))
        return repo / classify_pipeline.MODEL / "1"
    from bench import embeddings

    return embeddings.ortserve_package(embeddings.WORK, model) / model / "1"


def session(path: Path) -> ort.InferenceSession:
    """As server/sessions.py opens a CPU graph with --intra-op-spinning on."""
    from server.sessions import DISABLED_OPTIMIZERS

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=DISABLED_OPTIMIZERS)


def fused_graph(package: Path, manifest: dict[str, Any]) -> Path:
    """The fp32 graph through export/variants.py's optimized build (written once beside the package's work)."""
    from export.variants import build_optimized

    out = package.parents[2] / f"{manifest['name']}.fused.onnx"
    if not out.is_file():
        cfg = json.loads(Path(manifest["source"]["checkpoint"], "config.json").read_text())
        build_optimized(package / manifest["variants"]["fp32"], out, manifest["architecture"],
                        cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["hidden_size"])
    return out


class Feeder:
    """Right-padded feeds of the package's tokenizer for the inputs a session declares."""

    def __init__(self, package: Path, manifest: dict[str, Any]) -> None:
        self.tok = Tokenizer.from_file(str(package / "tokenizer.json"))
        self.tok.no_padding()
        self.tok.enable_truncation(manifest["max_length"])
        self.pad = manifest["special_tokens"]["pad"] or 0

    def __call__(self, texts: list[str], sess: ort.InferenceSession) -> dict[str, np.ndarray]:
        rows = [e.ids for e in self.tok.encode_batch(texts)]
        width = max(map(len, rows))
        ids = np.array([r + [self.pad] * (width - len(r)) for r in rows], np.int64)
        mask = np.array([[1] * len(r) + [0] * (width - len(r)) for r in rows], np.int64)
        names = {i.name for i in sess.get_inputs()}
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        return {k: v for k, v in feeds.items() if k in names}


def accuracy(sessions: dict[str, ort.InferenceSession], feed: Feeder, texts: list[str], task: str
             ) -> dict[str, dict[str, float]]:
    """Each non-fp32 graph against fp32: cosine of the vectors (embed) or top-1 agreement (classify)."""
    out = {}
    ref = sessions["fp32"]
    for name, sess in sessions.items():
        if name == "fp32":
            continue
        scores = []
        for i in range(0, len(texts), BATCH):
            chunk = texts[i:i + BATCH]
            a, b = ref.run(None, feed(chunk, ref))[0], sess.run(None, feed(chunk, sess))[0]
            if task == "embed":
                scores.append((a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)))
            else:
                scores.append((a.argmax(-1) == b.argmax(-1)).astype(np.float64))
        s = np.concatenate(scores)
        out[name] = ({"min_cosine": float(s.min()), "mean_cosine": float(s.mean())} if task == "embed"
                     else {"top1_agreement": float(s.mean()), "texts": len(s)})
    return out


def timed(sessions: dict[str, ort.InferenceSession], feed: Feeder, batch: list[str], rounds: int
          ) -> dict[str, dict[str, Any]]:
    feeds = {name: feed(batch, s) for name, s in sessions.items()}
    for name, s in sessions.items():      # warm: arenas, the first call's allocations
        for _ in range(2):
            s.run(None, feeds[name])
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for r in range(rounds):
        for name in (list(sessions) if r % 2 == 0 else list(sessions)[::-1]):
            t0 = time.perf_counter()
            for _ in range(3):
                sessions[name].run(None, feeds[name])
            times[name].append((time.perf_counter() - t0) / 3 * 1e3)
    fp32 = statistics.median(times["fp32"])
    return {name: {"ms": statistics.median(t), "speedup": fp32 / statistics.median(t), "runs_ms": t}
            for name, t in times.items()}


def run(a: argparse.Namespace) -> None:
    package = package_dir(a.model)
    manifest = json.loads((package / "model.json").read_text())
    graphs = {v: package / f for v, f in manifest["variants"].items()}
    if a.fused:
        graphs["fused"] = fused_graph(package, manifest)
    sessions = {name: session(path) for name, path in graphs.items()}
    feed = Feeder(package, manifest)
    short, long_ = passages(64, 12, seed=11), passages(64, 40, seed=12)
    result: dict[str, Any] = {"model": a.model, "invocation": a.invocation,
                              "default_variant": manifest["default_variant"], "load_average": os.getloadavg(),
                              "accuracy": accuracy(sessions, feed, short + long_, manifest["task"])}
    for label, texts in (("short", short), ("long", long_)):
        shape = feed(texts[:BATCH], sessions["fp32"])["input_ids"].shape
        result[label] = {"tokens": list(shape), **timed(sessions, feed, texts[:BATCH], a.rounds)}
        log.info("%s batch %s: %s", label, shape, {k: f"{v['ms']:.0f} ms ({v['speedup']:.2f}x)"
                                                   for k, v in result[label].items() if k != "tokens"})
    result["load_average_after"] = os.getloadavg()
    print(json.dumps({k: v for k, v in result.items()}, indent=1, default=float))
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", choices=("xlmr", "modernbert", "deberta-v3"), required=True)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--fused", action="store_true", help="add onnxruntime's fused-attention graph (XLM-R)")
    p.add_argument("--out", type=Path, default=None, help="write the result JSON here")


BENCHMARK = Benchmark(summary=__doc__, sides=("onnxruntime",), options=options, run=run)
