"""The encoder and decoder tasks' builder (classify, token-classify, fill-mask, generate), plugged into
export/skeleton.py."""
from __future__ import annotations

import logging
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from tokenizers import Tokenizer

from modelpkg import CacheSpec, Manifest, padded_head_dim

from . import decoder_graph, decoder_weights, graphs, int8, package, probes, speed, variants, weights, wiring_fault
from . import gemma_graph  # noqa: F401  (registers the Gemma family's weights and graph builder)
from .checkpoint_tokens import chat_template, special_tokens
from .context_cap import capped_length, position_key
from .config import TASKS, VARIANTS, WEIGHT_VARIANTS, ExportConfig
from .errors import ExportError
from .head_activation import head_activation
from .heldout import BUILTIN_TEXTS, default_genre_split, kv8_texts, read_eval_data
from .package_manifest import new_manifest, tensors
from .parity import GateInputs, failure_table, refused, run_gate
from .result import ExportResult
from .skeleton import Built, Gated
from .source import CheckpointInfo, inspect_checkpoint, load_torch_model
from .tokenizer_check import package_tokenizer

log = logging.getLogger(__name__)

# Test hook: perturb one weight of the named variant's graph after it is built, so a test can prove the gate
# refuses to publish. Never set in production.
PERTURB_ENV = "ORTSERVE_EXPORT_PERTURB"


def _perturb(path: Path) -> None:
    if os.environ.get(wiring_fault.FAULT_ENV) == "wiring":   # a connection broken instead of a weight
        wiring_fault.drop_first_residual(path)
        return
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


def build_package(cfg: ExportConfig, info: CheckpointInfo, model: torch.nn.Module, out: Path
                  ) -> tuple[Built, Tokenizer]:
    """Write graphs, variants, tokenizer into `out`; return them with a version-less manifest, and the packaged
    tokenizer (the gate encodes with it)."""
    t0 = time.perf_counter()
    length = capped_length(cfg.max_length, info.max_positions, position_key(info.config))   # --max-length
    head_dim = info.head_dim
    vocab = int(info.config["vocab_size"])
    fp32 = out / variants.FILES["fp32"]
    inplace = cfg.task == "generate"   # a decoder: the in-place graph (export/decoder_graph.py)
    padded = {}
    if inplace:
        spec = decoder_graph.export_inplace(model, info.model_type, length, fp32)
        # The attention op takes head sizes in multiples of 16: other heads are zero-padded (exact); the cache
        # tensor then has the padded size, and the model's own is recorded beside it.
        head_dim = padded_head_dim(info.head_dim)
        if head_dim != info.head_dim:
            padded = {"model_head_dim": info.head_dim}
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
        elif v == "fp16" and inplace:
            for src, dst in ((fp32, path), (out / decoder_graph.MIXED_FILE, out / decoder_graph.FP16_MIXED_FILE)):
                variants.build_inplace_fp16(src, dst, keep_fp32=[o.name for o in onnx.load(str(src)).graph.output
                                                                 if o.name.endswith("logits")])
            builds[v] = variants.VariantBuild("fp16", path.name, notes=["fp16 weights, compute and cache; fp32 logits"])
        elif v == "fp16":
            builds[v] = variants.build_fp16(fp32, path)
    removed = package_tokenizer(info.path, out, length)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    if "int8" in cfg.variants:   # its smoothing factors are calibrated on text, through the packaged tokenizer
        builds["int8"] = variants.build_int8(fp32, out / variants.FILES["int8"],
                                             int8.calibration_feeds(tok, length))
    # The int8 cache's scales are calibrated on text (kv8 and the weight-quantized variants over it).
    calibration = tok.encode(kv8_texts()[0]).ids[:length] if inplace else []
    kv_scales = None
    if "kv8" in cfg.variants:
        kv_scales = decoder_graph.export_inplace_kv8(model, info.model_type, length,
                                                     out / variants.FILES["kv8"], [calibration])
        builds["kv8"] = variants.VariantBuild("kv8", variants.FILES["kv8"],
                                              notes=[f"int8 cache scales calibrated on {len(calibration)} tokens"])
    mixed_graphs = {"fp32": decoder_graph.MIXED_FILE, **({"kv8": decoder_graph.KV8_MIXED_FILE} if "kv8" in builds else {}),
                    **({"fp16": decoder_graph.FP16_MIXED_FILE} if "fp16" in builds else {})}
    wanted = [v for v in cfg.variants if v in weights.WEIGHT_VARIANTS]
    if wanted:
        w = decoder_weights.inplace_weights(model, info.model_type, length)
        if kv_scales is None and any(weights.WEIGHT_VARIANTS[v][1] for v in wanted):
            kv_scales = decoder_weights.calibrate_kv_scales(model, [calibration])
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
    cache = None
    if inplace:
        # mixed_graph: the fp32 twin, as servers before mixed_graphs read it
        cache = CacheSpec(info.num_layers, info.num_heads, head_dim, decoder_graph.LAYOUT,
                          num_kv_heads=info.num_kv_heads, model_head_dim=padded.get("model_head_dim"),
                          extra={"mixed_graph": decoder_graph.MIXED_FILE, "mixed_graphs": mixed_graphs},
                          has_layout=True)
    extra: dict[str, Any] = {}
    if wanted:   # how each weight-quantized variant was made (docs/model-package.md)
        extra["quantization"] = {v: weights.describe(v, cfg.weight_quant) for v in wanted}
    if cfg.task == "classify":   # how the server turns the head's logits into scores (export/head_activation.py)
        extra["head"] = head_activation(info.path, info.config)
    template = chat_template(info) if cfg.task == "generate" else None
    if template:
        extra["chat_template"] = template  # /v1/chat/completions renders it (docs/protocol.md)
    manifest = new_manifest(cfg.name, cfg.task, info, max_length=length, special_tokens=ids,
                            labels=info.labels if cfg.task in ("classify", "token-classify") else (),
                            mask_token=mask_token if cfg.task == "fill-mask" else None,
                            inputs=tensors(spec.inputs), outputs=tensors(spec.outputs), cache=cache,
                            variants={v: b.file for v, b in builds.items()}, extra=extra)
    return Built(manifest, builds, removed, export_s, mask_token), tok


def gate_inputs(cfg: ExportConfig, info: CheckpointInfo, model: torch.nn.Module, manifest: Manifest,
                tok: Tokenizer, labelled) -> GateInputs:
    return GateInputs(model=model, task=cfg.task, tokenizer=tok, special_tokens=dict(manifest.special_tokens),
                      max_length=manifest.max_length, num_layers=info.num_layers, num_heads=info.num_heads,
                      head_dim=info.head_dim, texts=list(BUILTIN_TEXTS), labelled=labelled,
                      tolerances=cfg.tolerances, grid=cfg.grid, threads=cfg.threads,
                      num_kv_heads=info.num_kv_heads if cfg.task == "generate" else None,
                      token_types=info.token_types)


def validate_config(cfg: ExportConfig) -> None:
    if cfg.task not in TASKS:
        raise ExportError(f"--task: {cfg.task!r} is not one of {', '.join(TASKS)}")
    unknown = [v for v in cfg.variants if v not in VARIANTS]
    if unknown:
        raise ExportError(f"--variants: unknown {', '.join(unknown)} (choose from {', '.join(VARIANTS)})")
    inplace = cfg.task == "generate"
    inplace_variants = ("fp32", "kv8", "fp16", *WEIGHT_VARIANTS)
    if inplace and set(cfg.variants) - set(inplace_variants):
        raise ExportError("--variants: the in-place decoder graph is written already fused (GroupQueryAttention, "
                          f"SkipLayerNormalization, FastGelu); it ships {', '.join(inplace_variants)} only")
    if "kv8" in cfg.variants and not inplace:
        raise ExportError("--variants: kv8 (an int8 KV cache) is a variant of the in-place decoder graph only "
                          "(--task generate)")
    quantized = [v for v in cfg.variants if v in WEIGHT_VARIANTS]
    if quantized and not inplace:
        raise ExportError(f"--variants: {quantized[0]} (weight-quantized MatMulNBits) is a variant of the in-place "
                          "decoder graph only (--task generate)")
    for flag, value in (("--max-source-length", cfg.max_source_length), ("--max-target-length", cfg.max_target_length)):
        if value is not None:
            raise ExportError(f"{flag}: applies to encoder-decoder checkpoints (Marian, BART, T5) only")
    if "fp32" not in cfg.variants:
        raise ExportError("--variants: fp32 is required (every other variant is derived from and checked against it)")
    package.validate_name(cfg.name)


def drop_refused(staging: Path, manifest: Manifest, report: dict, results) -> Manifest:
    """A refused quantized variant (int8, w8, w4, ...) leaves the package (its graphs, its manifest entries);
    parity.json keeps its figures under status "refused", and the log shows them."""
    gone = refused(results)
    if not gone:
        return manifest
    log.warning("%s: refused %s; publishing without them\n%s", manifest.name, ", ".join(gone),
                failure_table({v: results[v] for v in gone}))
    cache = manifest.cache
    mixed = dict(cache.extra.get("mixed_graphs", {})) if cache is not None else {}
    kept = dict(manifest.variants)
    extra = dict(manifest.extra)
    quantization = {v: d for v, d in extra.get("quantization", {}).items() if v not in gone}
    for v in gone:
        for name in (kept.pop(v), mixed.pop(v, None)):
            if name:
                (staging / name).unlink(missing_ok=True)
        report["variants"][v]["status"] = "refused: " + "; ".join(
            f"{c['name']} {c['value']:.4f} (limit {c['threshold']:g})" if "value" in c else c["name"]
            for c in report["variants"][v]["checks"] if not c["passed"])
    if "quantization" in extra:
        extra["quantization"] = quantization
        if not quantization:
            del extra["quantization"]
    if cache is not None and "mixed_graphs" in cache.extra:
        cache = replace(cache, extra={**cache.extra, "mixed_graphs": mixed})
    return replace(manifest, variants=kept, extra=extra, cache=cache)


class ModelBuilder:
    """The encoder and decoder tasks (classify, fill-mask, generate): graphs and variants from export/graphs.py,
    export/decoder_graph.py, export/variants.py and export/weights.py, checked by export/parity.py."""

    def __init__(self, cfg: ExportConfig) -> None:
        validate_config(cfg)
        self.cfg = cfg
        self.info = inspect_checkpoint(cfg.checkpoint, cfg.task)
        variants.refuse_unfused(self.info.model_type, cfg.variants)
        capped_length(cfg.max_length, self.info.max_positions, position_key(self.info.config))  # refused up front
        self.checkpoint = self.info.path
        if cfg.task == "classify":   # an activation we cannot serve is refused before any weight is loaded
            head_activation(self.info.path, self.info.config)

    def load(self) -> None:
        self.labelled = _labelled(self.cfg, self.info)
        self.model = load_torch_model(self.info, self.cfg.task)

    def build(self, staging: Path) -> Built:
        built, self.tokenizer = build_package(self.cfg, self.info, self.model, staging)
        return built

    def gate(self, built: Built, staging: Path) -> Gated:
        files = {v: staging / b.file for v, b in built.builds.items()}
        return Gated(*run_gate(gate_inputs(self.cfg, self.info, self.model, built.manifest, self.tokenizer,
                                           self.labelled), files))

    def failure_text(self, gated: Gated, tok_report, report: dict) -> str:
        return failure_table(gated.results, report["tokenizer"])

    def finish(self, staging: Path, manifest: Manifest, report: dict, gated: Gated) -> Manifest:
        manifest = drop_refused(staging, manifest, report, gated.results)
        speed.record(staging, manifest, report)
        probes.record(staging, manifest, self.tokenizer, report)
        return replace(manifest, default_variant=package.default_variants(dict(manifest.variants),
                                                                          report["variants"]))

    def published(self, result: ExportResult) -> None:
        pass
