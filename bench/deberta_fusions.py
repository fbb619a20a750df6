"""Whether onnxruntime's transformer fusions help a DeBERTa-v2/v3 encoder graph (issue 38, part 4).

    python -m bench.deberta_fusions [--layers 12 --hidden 384 --heads 6 --batch 8 --seq 128 --threads 2]

Builds a random transformers DebertaV2ForSequenceClassification of DeBERTa-v3-xsmall's shape (relative positions
only, 256 buckets, shared keys; vocabulary cut to 8000 to keep the export small), exports it through the project's
own path (`python -m export`, fp32), then runs onnxruntime's `optimize_model` over the graph with model_type "bert"
(what export/variants.py's `optimized` variant does for the BERT family), with and without the residual-norm
fusion, builds the int8 variant (export/int8.py), and times each graph on a padded batch of the given shape (medians of alternating rounds, the machine's
load varies). Prints the fused-operator counts, the milliseconds per batch and the largest logit difference.
The findings go to bench/FINDINGS.md ("DeBERTa-v2/v3 graphs and onnxruntime's fusions").
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort


def _checkpoint(root: Path, a: argparse.Namespace) -> Path:
    import torch
    import transformers

    from tests.deberta_models import unigram_tokenizer

    tok = unigram_tokenizer(root / "tok", vocab_size=2000)
    cfg = transformers.DebertaV2Config(
        vocab_size=8000, hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.heads,
        intermediate_size=4 * a.hidden, max_position_embeddings=512, relative_attention=True, position_buckets=256,
        max_relative_positions=-1, pos_att_type=["p2c", "c2p"], position_biased_input=False,
        norm_rel_ebd="layer_norm", share_att_key=True, type_vocab_size=0, num_labels=3)
    torch.manual_seed(0)
    out = root / "ckpt"
    transformers.DebertaV2ForSequenceClassification(cfg).eval().save_pretrained(out)
    for f in tok.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    return out


def _optimized(src: Path, out: Path, a: argparse.Namespace, skip_norm: bool) -> dict[str, int]:
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    options.enable_skip_layer_norm = options.enable_bias_skip_layer_norm = skip_norm
    opt = optimize_model(str(src), model_type="bert", num_heads=a.heads, hidden_size=a.hidden,
                         optimization_options=options)
    opt.save_model_to_file(str(out), use_external_data_format=False)
    return {k: int(v) for k, v in opt.get_fused_operator_statistics().items() if v}


def _session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args(argv)
    from export import ExportConfig, export_checkpoint

    root = Path(tempfile.mkdtemp(prefix="deberta-fusions-"))
    result = export_checkpoint(ExportConfig(checkpoint=_checkpoint(root, a), task="classify",
                                            repository=root / "repo", name="deberta"))
    fp32 = result.package_dir / "model.onnx"
    graphs = {"fp32": fp32}
    fused = {}
    for name, skip in (("bert-fusions", False), ("bert-fusions+skipnorm", True)):
        graphs[name] = root / f"{name}.onnx"
        fused[name] = _optimized(fp32, graphs[name], a, skip)
    # the int8 variant as the export builds it (export/int8.py), calibrated on the gate's texts
    from tokenizers import Tokenizer

    from export import int8

    graphs["int8"] = root / "int8.onnx"
    int8.build(fp32, graphs["int8"], int8.calibration_feeds(Tokenizer.from_file(str(root / "tok" / "tokenizer.json")),
                                                            512))
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 8000, (a.batch, a.seq)).astype(np.int64)
    mask = np.ones_like(ids)
    for r in range(1, a.batch):   # lengths from seq down to about a third: a padded batch
        mask[r, a.seq - (r * 2 * a.seq) // (3 * a.batch):] = 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    sessions = {n: _session(g, a.threads) for n, g in graphs.items()}
    outs = {n: s.run(None, feeds)[0] for n, s in sessions.items()}
    times: dict[str, list[float]] = {n: [] for n in sessions}
    for _ in range(a.rounds):
        for n, s in sessions.items():
            t0 = time.perf_counter()
            for _ in range(3):
                s.run(None, feeds)
            times[n].append((time.perf_counter() - t0) / 3 * 1e3)
    print(json.dumps({"onnxruntime": ort.__version__, "shape": vars(a), "fused_operators": fused,
                      "ms_per_batch_median": {n: round(statistics.median(t), 2) for n, t in times.items()},
                      "ms_per_batch_min_max": {n: [round(min(t), 2), round(max(t), 2)] for n, t in times.items()},
                      "max_abs_diff_vs_fp32": {n: float(np.abs(o - outs["fp32"]).max()) for n, o in outs.items()}},
                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
