"""Checkpoint directory -> parity-checked, atomically published model package (the library entry point)."""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from tokenizers import Tokenizer

from modelpkg import padded_head_dim

from . import decoder_graph, graphs, package, speed, variants, weights
from .config import OPSET, TASKS, VARIANTS, WEIGHT_VARIANTS, ExportConfig
from .errors import ExportError, ParityFailure
from .heldout import BUILTIN_TEXTS, default_genre_split, kv8_texts, read_eval_data
from .parity import GateInputs, failure_table, refused, run_gate
from .checkpoint_tokens import chat_template, special_tokens
from .report import parity_report
from .result import ExportResult
from .source import LLAMA_TYPES, CheckpointInfo, inspect_checkpoint, load_torch_model
from .tokenizer_check import check_tokenizer, package_tokenizer

log = logging.getLogger(__name__)

# Test hook: perturb one weight of the named variant's graph after it is built, so a test can prove the gate
# refuses to publish. Never set in production.
PERTURB_ENV = "ORTSERVE_EXPORT_PERTURB"


def _perturb(path: Path) -> None:
    model = onnx.load(str(path))
    biggest = max((t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT),
                  key=lambda t: int(np.prod(t.dims)))
    arr = onnx.numpy_helper.to_array(biggest).copy()
    # Alternating signs on every 7th element: a constant shift of whole rows would vanish in a LayerNorm.
    arr.flat[::7] += 0.5 * np.resize([1.0, -1.0], arr.flat[::7].shape)
    biggest.CopyFrom(onnx.numpy_helper.from_array(arr, biggest.name))
    onnx.save(model, str(path))
    log.warning("%s set: perturbed %s in %s", PERTURB_ENV, biggest.name, path.name)


def _labelled(cfg: ExportConfig, info: CheckpointInfo):
    if cfg.task != "classify":
        if cfg.eval_data is not None:
            raise ExportError("--eval-data: labelled data applies to --task classify only")
        return None
    if cfg.eval_data is None and not {"int8", "fp16"} & set(cfg.variants):
        return None   # only the agreement / accuracy rules of int8 and fp16 read it: no need to parse the plays
    if cfg.eval_data is not None:
        return read_eval_data(cfg.eval_data, info.labels)
    return default_genre_split(info.labels)


def build_package(cfg: ExportConfig, info: CheckpointInfo, model: torch.nn.Module, out: Path) -> dict[str, Any]:
    """Write graphs, variants, tokenizer and a version-less manifest into `out`; return what the gate needs."""
    t0 = time.perf_counter()
    head_dim = info.head_dim
    vocab = int(info.config["vocab_size"])
    fp32 = out / variants.FILES["fp32"]
    inplace = cfg.task == "generate" and cfg.cache_layout == "inplace"
    padded = {}
    if inplace:
        spec = decoder_graph.export_inplace(model, info.model_type, info.max_positions, fp32)
        # The attention op takes head sizes in multiples of 16: other heads are zero-padded (exact); the cache
        # tensor then has the padded size, and the model's own is recorded beside it.
        head_dim = padded_head_dim(info.head_dim)
        if head_dim != info.head_dim:
            padded = {"model_head_dim": info.head_dim}
    elif cfg.task == "generate":
        if info.model_type in LLAMA_TYPES:
            raise ExportError("--cache-layout: a Llama-family decoder exports with the in-place cache only "
                              "(rotary and grouped-query attention are inside its attention op)")
        spec = graphs.export_decoder(model, info.num_layers, info.num_heads, head_dim, vocab, fp32)
    else:
        spec = graphs.export_encoder(model, cfg.task, vocab, fp32, token_types=info.token_types)
    builds: dict[str, variants.VariantBuild] = {"fp32": variants.VariantBuild("fp32", fp32.name)}
    if padded:
        builds["fp32"].notes.append(f"attention heads zero-padded from {info.head_dim} to {head_dim} channels "
                                    f"(q.k scaled by 1/sqrt({info.head_dim})); every in-place graph shares them")
    arch = info.model_type
    for v in cfg.variants:
        path = out / variants.FILES[v]
        if v == "optimized":
            builds[v] = variants.build_optimized(fp32, path, arch, info.num_layers, info.num_heads, info.hidden_size)
        elif v == "int8":
            builds[v] = variants.build_int8(fp32, path)
        elif v == "fp16" and inplace:
            for src, dst in ((fp32, path), (out / decoder_graph.MIXED_FILE, out / decoder_graph.FP16_MIXED_FILE)):
                variants.build_inplace_fp16(src, dst, keep_fp32=[o.name for o in onnx.load(str(src)).graph.output
                                                                 if o.name.endswith("logits")])
            builds[v] = variants.VariantBuild("fp16", path.name, notes=["fp16 weights, compute and cache; fp32 logits"])
        elif v == "fp16":
            builds[v] = variants.build_fp16(fp32, path)
    removed = package_tokenizer(info.path, out, info.max_positions)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    # The int8 cache's scales are calibrated on text (kv8 and the weight-quantized variants over it).
    calibration = tok.encode(kv8_texts()[0]).ids[:info.max_positions] if inplace else []
    kv_scales = None
    if "kv8" in cfg.variants:
        kv_scales = decoder_graph.export_inplace_kv8(model, info.model_type, info.max_positions,
                                                     out / variants.FILES["kv8"], [calibration])
        builds["kv8"] = variants.VariantBuild("kv8", variants.FILES["kv8"],
                                              notes=[f"int8 cache scales calibrated on {len(calibration)} tokens"])
    mixed_graphs = {"fp32": decoder_graph.MIXED_FILE, **({"kv8": decoder_graph.KV8_MIXED_FILE} if "kv8" in builds else {}),
                    **({"fp16": decoder_graph.FP16_MIXED_FILE} if "fp16" in builds else {})}
    wanted = [v for v in cfg.variants if v in weights.WEIGHT_VARIANTS]
    if wanted:
        w = decoder_graph.inplace_weights(model, info.model_type, info.max_positions)
        if kv_scales is None and any(weights.WEIGHT_VARIANTS[v][1] for v in wanted):
            kv_scales = decoder_graph.calibrate_kv_scales(model, [calibration])
        for v in wanted:
            try:
                builds[v] = weights.build_variant(v, w, out, cfg.weight_quant, kv_scales, len(calibration))
            except (ValueError, RuntimeError, onnx.checker.ValidationError) as exc:
                raise ExportError(f"--variants: {v}: the quantizer failed ({str(exc).splitlines()[0]})") from None
            mixed_graphs[v] = weights.variant_files(v)[1]
    target = os.environ.get(PERTURB_ENV)
    if target:
        _perturb(out / variants.FILES[target])
    export_s = time.perf_counter() - t0
    ids, mask_token = special_tokens(info, tok)
    manifest = {
        "format": package.FORMAT, "name": cfg.name, "version": None, "task": cfg.task,
        "architecture": arch,
        "labels": info.labels if cfg.task == "classify" else [],
        "max_length": info.max_positions, "vocab_size": vocab,
        "special_tokens": ids, "mask_token": mask_token if cfg.task == "fill-mask" else None,
        "inputs": [t.as_json() for t in spec.inputs], "outputs": [t.as_json() for t in spec.outputs],
        "cache": ({"num_layers": info.num_layers, "num_heads": info.num_heads, "head_dim": head_dim,
                   "num_kv_heads": info.num_kv_heads, **padded,
                   "layout": decoder_graph.LAYOUT if inplace else "concat",
                   # mixed_graph: the fp32 twin, as servers before mixed_graphs read it
                   **({"mixed_graph": decoder_graph.MIXED_FILE, "mixed_graphs": mixed_graphs} if inplace else {})}
                  if cfg.task == "generate" else None),
        "variants": {v: b.file for v, b in builds.items()}, "default_variant": None, "opset": OPSET,
        "source": {"checkpoint": str(info.path), "architecture": info.architecture,
                   "config_sha256": info.config_sha256, "checkpoint_sha256": info.weights_sha256},
        "created_at": package.utc_now(),
    }
    if wanted:   # how each weight-quantized variant was made (docs/model-package.md)
        manifest["quantization"] = {v: weights.describe(v, cfg.weight_quant) for v in wanted}
    template = chat_template(info) if cfg.task == "generate" else None
    if template:
        manifest["chat_template"] = template  # /v1/chat/completions renders it (docs/protocol.md)
    return {"manifest": manifest, "builds": builds, "removed": removed, "export_s": export_s,
            "tokenizer": tok, "mask_token": mask_token}


def gate_inputs(cfg: ExportConfig, info: CheckpointInfo, model: torch.nn.Module, manifest: dict,
                tok: Tokenizer, labelled) -> GateInputs:
    return GateInputs(model=model, task=cfg.task, tokenizer=tok, special_tokens=manifest["special_tokens"],
                      max_length=manifest["max_length"], num_layers=info.num_layers, num_heads=info.num_heads,
                      head_dim=info.head_dim, texts=list(BUILTIN_TEXTS), labelled=labelled,
                      tolerances=cfg.tolerances, grid=cfg.grid, threads=cfg.threads,
                      cache_layout=(manifest.get("cache") or {}).get("layout", "concat"),
                      num_kv_heads=info.num_kv_heads if cfg.task == "generate" else None,
                      token_types=info.token_types)


def validate_config(cfg: ExportConfig) -> None:
    if cfg.task not in TASKS:
        raise ExportError(f"--task: {cfg.task!r} is not one of {', '.join(TASKS)}")
    unknown = [v for v in cfg.variants if v not in VARIANTS]
    if unknown:
        raise ExportError(f"--variants: unknown {', '.join(unknown)} (choose from {', '.join(VARIANTS)})")
    inplace = cfg.task == "generate" and cfg.cache_layout == "inplace"
    inplace_variants = ("fp32", "kv8", "fp16", *WEIGHT_VARIANTS)
    if inplace and set(cfg.variants) - set(inplace_variants):
        raise ExportError("--variants: the in-place decoder graph is written already fused (GroupQueryAttention, "
                          f"SkipLayerNormalization, FastGelu); it ships {', '.join(inplace_variants)} only "
                          "(or use --cache-layout concat)")
    if "kv8" in cfg.variants and not inplace:
        raise ExportError("--variants: kv8 (an int8 KV cache) is a variant of the in-place decoder graph only "
                          "(--task generate --cache-layout inplace)")
    quantized = [v for v in cfg.variants if v in WEIGHT_VARIANTS]
    if quantized and not inplace:
        raise ExportError(f"--variants: {quantized[0]} (weight-quantized MatMulNBits) is a variant of the in-place "
                          "decoder graph only (--task generate --cache-layout inplace)")
    if "fp32" not in cfg.variants:
        raise ExportError("--variants: fp32 is required (every other variant is derived from and checked against it)")
    package.validate_name(cfg.name)


def drop_refused(staging: Path, manifest: dict, report: dict, results) -> None:
    """A refused weight-quantized variant leaves the package (its graphs, its manifest entries); parity.json
    keeps its figures under status "refused", and the log shows them."""
    gone = refused(results)
    if not gone:
        return
    log.warning("%s: refused %s; publishing without them\n%s", manifest["name"], ", ".join(gone),
                failure_table({v: results[v] for v in gone}))
    mixed = (manifest.get("cache") or {}).get("mixed_graphs", {})
    for v in gone:
        manifest.get("quantization", {}).pop(v, None)
        for name in (manifest["variants"].pop(v), mixed.pop(v, None)):
            if name:
                (staging / name).unlink(missing_ok=True)
        report["variants"][v]["status"] = "refused: " + "; ".join(
            f"{c['name']} {c['value']:.4f} (limit {c['threshold']:g})" if "value" in c else c["name"]
            for c in report["variants"][v]["checks"] if not c["passed"])
    if not manifest.get("quantization", True):
        del manifest["quantization"]


def export_checkpoint(cfg: ExportConfig) -> ExportResult:
    """Export, gate, publish. Raises ExportError (bad input) or ParityFailure; publishes nothing on either."""
    if cfg.task == "embed":  # its own graph and gate (export/embed.py)
        from .embed import export_embedding

        return export_embedding(cfg)
    validate_config(cfg)
    info = inspect_checkpoint(cfg.checkpoint, cfg.task)
    repo = Path(cfg.repository)
    if repo.exists() and not repo.is_dir():
        raise ExportError(f"--repository: {repo} is not a directory")
    name_dir = repo / cfg.name
    version = package.choose_version(name_dir, cfg.version)
    labelled = _labelled(cfg, info)
    model = load_torch_model(info, cfg.task)
    created = not name_dir.exists()
    staging = package.staging_dir(name_dir)
    try:
        built = build_package(cfg, info, model, staging)
        manifest = built["manifest"]
        tok_report = check_tokenizer(info.path, staging, list(BUILTIN_TEXTS), built["mask_token"],
                                     manifest["max_length"], built["removed"])
        files = {v: staging / b.file for v, b in built["builds"].items()}
        passed, results, gate_s = run_gate(gate_inputs(cfg, info, model, manifest, built["tokenizer"], labelled),
                                           files)
        passed = passed and tok_report.passed
        report = parity_report(passed, results, built["builds"], tok_report, built["export_s"], gate_s)
        if not passed:
            raise ParityFailure(f"parity gate failed for {cfg.name}; nothing published\n"
                                + failure_table(results, report["tokenizer"]), report)
        drop_refused(staging, manifest, report, results)
        speed.record(staging, manifest, report)
        manifest["default_variant"] = package.default_variants(manifest["variants"], report["variants"])

        version = package.publish_package(staging, name_dir, version, cfg.version is None, manifest, report)
    except BaseException:
        package.discard(staging, name_dir, created)
        raise
    final = name_dir / str(version)
    return ExportResult(final, version, json.loads((final / package.PARITY).read_text()))
