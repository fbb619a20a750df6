"""Does onnxruntime's transformer optimizer help the ModernBERT encoder graph? (export/variants.py decides from it)

    python -m bench modernbert_fusion [--hidden 256 --layers 4 --batch 8 --seq 128 --threads 2]

Builds a random transformers ModernBertForSequenceClassification (alternating global / local layers, window
--window), exports it as `python -m export` does (export/graphs.py, TorchScript), then times onnxruntime sessions
the way the server opens them (full graph optimization, SkipLayerNormFusion off: server/sessions.py) on a padded
batch: the fp32 graph, the graph after `optimize_model(model_type="bert")` (what the optimized variant of the BERT
families is) with the fused operators it reports, and the int8 variant (export/int8.py). Each graph's max |diff|
against transformers is printed beside its time.
"""
from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from bench.harness import Benchmark


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--window", type=int, default=64, help="local_attention (the whole window)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=30)


def _session(path: Path, threads: int) -> ort.InferenceSession:
    from server.sessions import DISABLED_OPTIMIZERS

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"],
                                disabled_optimizers=DISABLED_OPTIMIZERS)


def _interleaved_ms(sessions: dict[str, ort.InferenceSession], feeds: dict[str, np.ndarray], runs: int
                   ) -> dict[str, float]:
    """Median ms per call, the graphs taking turns call by call (a shared machine's load falls on all alike)."""
    for session in sessions.values():
        for _ in range(3):
            session.run(None, feeds)
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(runs):
        for name, session in sessions.items():
            t0 = time.perf_counter()
            session.run(None, feeds)
            times[name].append(time.perf_counter() - t0)
    return {name: float(np.median(t)) * 1e3 for name, t in times.items()}


def run(a: argparse.Namespace) -> None:
    import transformers
    from onnxruntime.transformers.optimizer import optimize_model

    from export import graphs, int8
    from training.checkpoint import load_model

    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(
        vocab_size=1000, hidden_size=a.hidden, intermediate_size=a.hidden * 3 // 2, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, max_position_embeddings=max(512, a.seq), local_attention=a.window,
        global_attn_every_n_layers=2, pad_token_id=0, bos_token_id=1, cls_token_id=1, eos_token_id=2, sep_token_id=2)
    hf = transformers.ModernBertForSequenceClassification(config).eval()
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 1000, (a.batch, a.seq)).astype(np.int64)
    mask = np.ones_like(ids)
    for r in range(a.batch):   # lengths from a quarter to all of seq: padded rows far past a window
        n = int(a.seq * (1 + 3 * r / max(1, a.batch - 1)) / 4)
        ids[r, n:], mask[r, n:] = 0, 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    with torch.no_grad():
        want = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        hf.save_pretrained(work / "ckpt")
        ours, _ = load_model(work / "ckpt")
        graphs.export_encoder(ours, "classify", 1000, work / "fp32.onnx", token_types=False)
        opt = optimize_model(str(work / "fp32.onnx"), model_type="bert", num_heads=a.heads, hidden_size=a.hidden)
        fused = {k: int(v) for k, v in opt.get_fused_operator_statistics().items() if v}
        opt.save_model_to_file(str(work / "optimized.onnx"), use_external_data_format=False)
        calib = [{"input_ids": ids[r:r + 1, :int(mask[r].sum())], "attention_mask": mask[r:r + 1, :int(mask[r].sum())]}
                 for r in range(a.batch)]
        int8.build(work / "fp32.onnx", work / "int8.onnx", calib)
        print(f"onnxruntime {ort.__version__}; ModernBERT hidden {a.hidden}, {a.layers} layers, window {a.window}; "
              f"batch {a.batch} x seq {a.seq} (padded); {a.threads} threads; median of {a.runs}, graphs interleaved")
        print(f"optimize_model(model_type='bert') fused: {fused or 'nothing'}")
        with torch.no_grad():
            t0 = time.perf_counter()
            for _ in range(a.runs):
                hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
            print(f"{'transformers (sdpa)':>22} {(time.perf_counter() - t0) / a.runs * 1e3:8.2f} ms")
        sessions = {name: _session(work / f"{name}.onnx", a.threads) for name in ("fp32", "optimized", "int8")}
        times = _interleaved_ms(sessions, feeds, a.runs)
        for name, session in sessions.items():
            got = session.run(None, feeds)[0]
            print(f"{name:>22} {times[name]:8.2f} ms   max |diff| {np.abs(got - want).max():.2e}")


BENCHMARK = Benchmark(summary=__doc__, sides=("onnxruntime",), options=options, run=run)
