"""Derived variants of the fp32 graph: optimized (transformer fusions), int8 (per-token, export/int8.py), fp16 (GPU).
The in-place decoder's kv8 (int8 KV cache) is written from the weights by decoder_graph.py, its weight-quantized
w8 / w4 / w8kv8 / w4kv8 by weights.py."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from .errors import ExportError

log = logging.getLogger(__name__)

FILES = {"fp32": "model.onnx", "optimized": "model.optimized.onnx", "int8": "model.int8.onnx",
         "fp16": "model.fp16.onnx", "kv8": "model.kv8.onnx",
         # weight-quantized in-place decoders (export/weights.py); each has a mixed twin model.<v>.mixed.onnx
         "w8": "model.w8.onnx", "w4": "model.w4.onnx", "w8kv8": "model.w8kv8.onnx", "w4kv8": "model.w4kv8.onnx"}


@dataclass
class VariantBuild:
    """What building one variant produced (goes into parity.json next to its checks)."""

    variant: str
    file: str
    fused_operators: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


ENCODER_FAMILIES = ("bert", "roberta", "albert", "distilbert", "electra")
ENCODER_FAMILIES += ("xlm-roberta",)
# Encoder families without an optimized variant, and why (refused by name before anything is built; measured:
# bench/FINDINGS.md).
UNFUSED_FAMILIES = {
    # optimize_model(model_type="bert") finds no Attention in a graph whose queries and keys are rotated, and fuses
    # only Gelu, which onnxruntime's own session optimizations fuse at load anyway ("ModernBERT and onnxruntime's
    # fusions").
    "modernbert": "--variants: optimized: ModernBERT's rotary attention matches none of onnxruntime's Attention "
                  "fusions; its graph is exported unfused (fp32, int8)",
    # The BERT fusions leave Attention unfused (c2p / p2c gathers between the products) and add only BiasGelu, with
    # no gain measured ("DeBERTa-v2/v3 graphs and onnxruntime's fusions").
    "deberta-v2": "--variants optimized: DeBERTa's disentangled attention has no onnxruntime fusion (its BERT "
                  "fusions leave Attention unfused and add only BiasGelu, no gain measured: bench/FINDINGS.md); "
                  "export fp32 or int8",
    # optimize_model(model_type="bert") leaves Attention unfused when the relative-position bias is added to the
    # scores; it fuses only BiasGelu and the residual norms, which are kept unfused here anyway.
    "mpnet": "--variants optimized: MPNet's relative-position bias in the attention scores matches none of "
             "onnxruntime's Attention fusions; export fp32 or int8",
}


def refuse_unfused(architecture: str, wanted: tuple[str, ...]) -> None:
    """ExportError for --variants optimized on a family that has none."""
    if "optimized" in wanted and architecture in UNFUSED_FAMILIES:
        raise ExportError(UNFUSED_FAMILIES[architecture])


def expected_fusions(architecture: str, num_layers: int) -> dict[str, int]:
    """Fused-operator counts an eager-attention encoder of ENCODER_FAMILIES must reach (model_type "bert" fusion,
    measured per family).

    RoBERTa, DistilBERT and ELECTRA fuse like BERT (RoBERTa's cumsum positions only keep EmbedLayerNormalization
    from forming; ELECTRA's first layer fuses although it follows an E -> H projection, as measured). ALBERT fuses
    Attention on L-1 of its L passes: the first pass reads the E->H projection, not a LayerNorm output, and
    onnxruntime's attention fusion anchors on a LayerNorm.
    """
    return {"Attention": num_layers - 1 if architecture == "albert" else num_layers}


def build_optimized(fp32: Path, out: Path, architecture: str, num_layers: int, num_heads: int,
                    hidden_size: int) -> VariantBuild:
    """onnxruntime's BERT fusions on an encoder of a family whose fusions were measured (ENCODER_FAMILIES);
    ExportError naming any other family, nothing guessed (a decoder's in-place graph is written fused already:
    model_builder refuses `optimized` for it before this)."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    if architecture not in ENCODER_FAMILIES:
        raise ExportError(f"--variants optimized: no fusion of onnxruntime's is measured for the {architecture!r} "
                          "family; export fp32 or int8")
    model_type = "bert"
    options = FusionOptions(model_type)
    # Residual + LayerNorm stay two ops: the fused op is the slower one here ("Residual norms", decoder_graph.py).
    options.enable_skip_layer_norm = options.enable_bias_skip_layer_norm = False
    opt = optimize_model(str(fp32), model_type=model_type, num_heads=num_heads, hidden_size=hidden_size,
                         optimization_options=options)
    stats = {k: int(v) for k, v in opt.get_fused_operator_statistics().items() if v}
    log.info("optimized (%s) fused operators: %s", model_type, stats)
    missing = {op: (n, stats.get(op, 0)) for op, n in expected_fusions(architecture, num_layers).items()
               if stats.get(op, 0) < n}
    if missing:
        detail = ", ".join(f"{op} {got}/{want}" for op, (want, got) in missing.items())
        raise ExportError(f"--variants optimized: expected fusion did not happen ({detail}); fused: {stats}")
    opt.save_model_to_file(str(out), use_external_data_format=False)
    build = VariantBuild("optimized", out.name, fused_operators=stats,
                         notes=["residual + LayerNorm unfused (SkipLayerNormalization is slower on CPU)"])
    if architecture == "albert":
        build.notes.append("Attention fused on all but the first shared-layer pass (it reads the E->H projection)")
    return build


def build_int8(fp32: Path, out: Path, calibration: list[dict[str, np.ndarray]]) -> VariantBuild:
    """Per-token int8 activations x per-channel int8 weights after SmoothQuant (export/int8.py), on the UNFUSED
    graph: the rewrite reads plain weight MatMuls, which the fused graph folds into Attention."""
    from . import int8

    return VariantBuild("int8", out.name, notes=int8.build(fp32, out, calibration))


def build_fp16(fp32: Path, out: Path) -> VariantBuild:
    """fp16 weights and compute, fp32 inputs/outputs (keep_io_types) so clients never see fp16."""
    _to_fp16(fp32, out, keep_io_types=True)
    return VariantBuild("fp16", out.name, notes=["convert_float_to_float16 keep_io_types=True"])


def build_inplace_fp16(fp32: Path, out: Path, keep_fp32: list[str]) -> None:
    """An in-place decoder in fp16 for the CUDA provider, whose GroupQueryAttention kernel takes fp16 (or bf16)
    only: weights, compute AND the cache buffers in fp16 (half the cache memory); the `keep_fp32` outputs (the
    logits the sampler reads) stay fp32."""
    _to_fp16(fp32, out, keep_io_types=keep_fp32)


def _to_fp16(src: Path, out: Path, keep_io_types: bool | list[str]) -> None:
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = convert_float_to_float16(onnx.load(str(src)), keep_io_types=keep_io_types)
    # The converter appends the input casts after their consumers; the checker (and some runtimes) need order.
    wrapped = OnnxModel(model)
    wrapped.topological_sort()
    model = wrapped.model
    onnx.checker.check_model(model)
    onnx.save(model, str(out))
