"""Encoder latency: torch eager vs ORT fp32 / optimized / int8 vs the HF pipeline, and achieved GFLOP/s.

Every backend runs the same weights on the same token ids with 2 intra-op threads. Backends are timed
interleaved (one call each, round after round), so machine noise hits all of them alike and the ratios
of one run stay comparable.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .config import EncoderConfig
from .flops import bert_classifier_flops, sgemm_call, sgemm_rate
from .material import (Checkpoint, Package, classifier_checkpoint, export_package, passages, random_bert,
                       shared_dir)
from .ortprofile import profile_runs, session
from .stats import Summary, ratio

log = logging.getLogger(__name__)

ORT_VARIANTS = ("fp32", "optimized", "int8")


def encode(tokenizer_json: Path, texts: list[str], seq: int) -> dict[str, np.ndarray]:
    """Token ids exactly `seq` long (truncated / padded) with the package's own tokenizer."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    pad_id = tok.token_to_id("[PAD]") or 0
    tok.enable_truncation(max_length=seq)
    tok.enable_padding(length=seq, pad_id=pad_id, pad_token="[PAD]")
    encs = tok.encode_batch(texts)
    return {"input_ids": np.array([e.ids for e in encs], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encs], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encs], dtype=np.int64)}


def time_interleaved(backends: dict[str, Callable[[], Any]], repeats: int, warmup: int = 2) -> dict[str, Summary]:
    for fn in backends.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in backends}
    for _ in range(repeats):
        for name, fn in backends.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return {name: Summary.of(s).scaled(1e3) for name, s in samples.items()}


def _model_shape(cfg: dict[str, Any]) -> dict[str, int]:
    return {"layers": int(cfg["num_hidden_layers"]), "hidden": int(cfg["hidden_size"]),
            "heads": int(cfg["num_attention_heads"]), "intermediate": int(cfg["intermediate_size"]),
            "labels": len(cfg.get("id2label") or {}) or 2, "vocab": int(cfg["vocab_size"])}


def _hf_pipeline(ckpt: Checkpoint) -> Any:
    """transformers' text-classification pipeline loaded from the checkpoint directory (same weights);
    it runs on torch, so torch.set_num_threads applies to it too."""
    from transformers import pipeline

    return pipeline("text-classification", model=str(ckpt.path), tokenizer=str(ckpt.path), device=-1)


def bench_model(ckpt: Checkpoint, pkg: Package, cfg: EncoderConfig, work: Path) -> dict[str, Any]:
    import torch

    from training.checkpoint import load_model

    shape = _model_shape(ckpt.config)
    model, _ = load_model(ckpt.path, kind="bert-classifier")
    model.eval()
    sessions = {v: session(pkg.variant_file(v), cfg.threads) for v in ORT_VARIANTS if pkg.variant_file(v)}
    pipe = _hf_pipeline(ckpt)
    texts_all = passages(max(b for b, _ in cfg.shapes), min_words=200, seed=1)
    out_shapes = []
    for batch, seq in cfg.shapes:
        texts = texts_all[:batch]
        feeds = encode(pkg.path / "tokenizer.json", texts, seq)
        t_feeds = {k: torch.from_numpy(v) for k, v in feeds.items()}
        with torch.inference_mode():
            ref = model(t_feeds["input_ids"], t_feeds["attention_mask"], t_feeds["token_type_ids"]).numpy()
        hf_ids = np.array(pipe.tokenizer(texts, truncation=True, max_length=seq, padding="max_length")["input_ids"])

        def run_torch() -> None:
            with torch.inference_mode():
                model(t_feeds["input_ids"], t_feeds["attention_mask"], t_feeds["token_type_ids"])

        backends: dict[str, Callable[[], Any]] = {"torch": run_torch}
        diffs: dict[str, float] = {}
        for v, sess in sessions.items():
            logits = sess.run(["logits"], feeds)[0]
            diffs[f"ort_{v}"] = float(np.abs(logits - ref).max())
            backends[f"ort_{v}"] = (lambda s=sess: s.run(["logits"], feeds))
        backends["hf_pipeline"] = lambda: pipe(texts, batch_size=batch, truncation=True, max_length=seq,
                                               padding="max_length")
        top = pipe(texts, batch_size=batch, truncation=True, max_length=seq, padding="max_length", top_k=1)
        labels = [r[0]["label"] if isinstance(r, list) else r["label"] for r in top]
        id2label = {int(k): v for k, v in (ckpt.config.get("id2label") or {}).items()}
        agree = float(np.mean([id2label.get(int(i)) == lab for i, lab in zip(ref.argmax(-1), labels)]))

        # The sgemm reference runs inside the same interleaved rounds: it sees the same machine noise.
        sgemm_fn, sgemm_flops = sgemm_call(cfg.sgemm_n)
        latency = time_interleaved({**backends, "sgemm": sgemm_fn}, cfg.repeats[(batch, seq)])
        sgemm_here = latency.pop("sgemm").inverse(sgemm_flops / 1e9 * 1e3)
        flops = bert_classifier_flops(shape["layers"], shape["hidden"], shape["intermediate"], shape["labels"],
                                      batch, seq)
        gflops = {name: s.inverse(flops / 1e9 * 1e3) for name, s in latency.items()}
        ratios = {f"{name}_speedup_vs_torch": ratio(latency["torch"], s) for name, s in latency.items()
                  if name != "torch"}
        if "ort_int8" in latency and "ort_fp32" in latency:
            ratios["ort_int8_speedup_vs_fp32"] = ratio(latency["ort_fp32"], latency["ort_int8"])
        if "ort_optimized" in latency and "ort_fp32" in latency:
            ratios["ort_optimized_speedup_vs_fp32"] = ratio(latency["ort_fp32"], latency["ort_optimized"])
        profiles = {v: profile_runs(pkg.variant_file(v), cfg.threads, feeds, cfg.profile_runs, work / "profiles",
                                    ["logits"]) for v in sessions}
        log.info("encoder %s b%d s%d: %s", ckpt.name, batch, seq,
                 ", ".join(f"{k} {s.median:.2f} ms" for k, s in latency.items()))
        out_shapes.append({
            "batch": batch, "seq": seq, "matmul_gflop": flops / 1e9,
            "latency_ms": {k: s.as_json() for k, s in latency.items()},
            "gflops": {k: s.as_json() for k, s in gflops.items()},
            "sgemm_gflops": sgemm_here.as_json(),
            "fraction_of_sgemm": {k: s.median / sgemm_here.median for k, s in gflops.items()},
            "ratios": ratios,
            "max_abs_diff_vs_torch": diffs,
            "hf_tokenizer_ids_equal": bool(hf_ids.shape == feeds["input_ids"].shape
                                           and (hf_ids == feeds["input_ids"]).all()),
            "hf_pipeline_top1_agreement_vs_torch": agree,
            "ort_profiles": profiles,
        })
    return {"checkpoint": ckpt.describe(), "shape": shape,
            "package": {"path": str(pkg.path), "variants": dict(pkg.manifest["variants"]), "notes": pkg.notes,
                        "fused_operators": {v: r.get("fused_operators") for v, r in pkg.parity["variants"].items()
                                            if r.get("fused_operators")}},
            "hf_attention": getattr(pipe.model.config, "_attn_implementation", None),
            "shapes": out_shapes}


def int8_accuracy(ckpt: Checkpoint, pkg: Package, cfg: EncoderConfig) -> dict[str, Any] | None:
    """fp32 vs int8 accuracy on the genre test split (trained classifier with the genre labels only)."""
    from training import data

    labels = pkg.manifest.get("labels") or []
    if not ckpt.trained or sorted(labels) != sorted(data.GENRES) or not pkg.variant_file("int8"):
        return None
    test = data.genre_data().splits["test"]
    if cfg.accuracy_limit:
        test = test[:cfg.accuracy_limit]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(pkg.path / "tokenizer.json"))
    tok.enable_truncation(max_length=int(pkg.manifest["max_length"]))
    pad = pkg.manifest["special_tokens"].get("pad") or 0
    tok.enable_padding(pad_id=pad, pad_token="[PAD]")
    gold = np.array([labels.index(e.label) for e in test])
    out: dict[str, Any] = {"examples": len(test), "split": "genre test (unseen plays)"}
    preds = {}
    for v in ("fp32", "int8"):
        sess = session(pkg.variant_file(v), cfg.threads)
        pred = []
        for i in range(0, len(test), 16):
            chunk = test[i:i + 16]
            encs = tok.encode_batch([(e.text, e.text_pair) if e.text_pair else e.text for e in chunk])
            feeds = {"input_ids": np.array([e.ids for e in encs], dtype=np.int64),
                     "attention_mask": np.array([e.attention_mask for e in encs], dtype=np.int64),
                     "token_type_ids": np.array([e.type_ids for e in encs], dtype=np.int64)}
            pred.append(sess.run(["logits"], feeds)[0].argmax(-1))
        preds[v] = np.concatenate(pred)
        out[f"accuracy_{v}"] = float((preds[v] == gold).mean())
    out["drop_points"] = 100.0 * (out["accuracy_fp32"] - out["accuracy_int8"])
    out["top1_agreement"] = float((preds["fp32"] == preds["int8"]).mean())
    return out


def run(cfg: EncoderConfig, work: Path) -> dict[str, Any]:
    import torch

    torch.set_num_threads(cfg.threads)
    sgemm = sgemm_rate(cfg.sgemm_n, cfg.sgemm_repeats)
    log.info("numpy sgemm %d: %.1f GFLOP/s", cfg.sgemm_n, sgemm.median)
    repo = work / "repository"
    models = []
    base_name = "bert-base-random" if cfg.base_layers == 12 else f"bert-base-width-L{cfg.base_layers}-random"
    ckpts = [classifier_checkpoint(shared_dir(work), cfg.sources.classifier),
             random_bert(shared_dir(work), base_name, "base", num_labels=2, **({} if cfg.base_layers == 12 else
                                                                   {"num_hidden_layers": cfg.base_layers}))]
    for ckpt in ckpts:
        pkg = export_package(ckpt, "classify", repo, ("fp32", "optimized", "int8"), threads=cfg.threads)
        entry = bench_model(ckpt, pkg, cfg, work)
        entry["int8_accuracy"] = int8_accuracy(ckpt, pkg, cfg)
        models.append(entry)
    return {"piece": "encoder", "threads": cfg.threads,
            "sgemm": {"n": cfg.sgemm_n, "gflops": sgemm.as_json()},
            "models": models}
