"""Weight-quantized variants of the in-place decoder: every weight MatMul becomes onnxruntime's MatMulNBits.

Made with onnxruntime's MatMulNBitsQuantizer, blockwise along the input dimension K: "rtn" (round to nearest,
one scale per block, symmetric) or "hqq" (half-quadratic, a scale and a float zero point per block, 4 bits).
A single step streams the weights once, so at batch 1 the step time follows their bytes (fp32 4 bytes a weight,
8 bits ~1.1, 4 bits ~0.6 with block 32).

The LM head is a Gemm over the (tied) embedding in the fp32 graph, which the quantizer does not touch; with
`lm_head_bits` it is rewritten as a MatMul over its own transposed copy first and quantized with that many bits
(8 under 4-bit layers, as llama.cpp keeps its output matrix above Q4_0), the embedding lookup keeping the fp32
table. Variants named here: w8, w4 and, over the int8-cache graph, w8kv8 / w4kv8.
"""
from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .config import WeightQuantConfig
from .graph_file import copy_model

log = logging.getLogger(__name__)

# variant -> (weight bits, int8 KV cache)
WEIGHT_VARIANTS: dict[str, tuple[int, bool]] = {"w8": (8, False), "w4": (4, False), "w8kv8": (8, True),
                                                "w4kv8": (4, True)}
ALGORITHMS = ("rtn", "hqq")
HEAD_WEIGHT = "lm_head.weight_t"   # the head's [hidden, vocab] copy a quantized head is made from
MIN_BLOCK = 16                     # MatMulNBits' smallest block


def variant_files(variant: str) -> tuple[str, str]:
    """(plain graph, mixed twin) file names of a weight-quantized variant."""
    return f"model.{variant}.onnx", f"model.{variant}.mixed.onnx"


def head_as_matmul(model: onnx.ModelProto) -> bool:
    """Rewrite the graph's head — Gemm(h, W, [bias], transB=1, alpha), or FusedMatMul(h, W, transB=1, alpha) — as
    MatMul(h, alpha * W^T) [+ bias] over its own initializer; False when the graph has no such head. (The
    encoder-decoder's head is the FusedMatMul, over [batch, sequence, hidden], carrying T5's output scale as alpha;
    BART / Marian's final_logits_bias is an Add after it: export/seq2seq_graph.py.)"""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}

    def attr(n: onnx.NodeProto, name: str, default: float) -> float:
        return next((a.f if a.type == onnx.AttributeProto.FLOAT else a.i for a in n.attribute if a.name == name),
                    default)
    heads = [n for n in graph.node if n.op_type == "Gemm" and n.input[1] in inits and attr(n, "transB", 0) == 1
             and attr(n, "transA", 0) == 0 and len(n.input) in (2, 3)
             and (len(n.input) == 2 or (n.input[2] in inits and attr(n, "beta", 1.0) == 1.0))]
    heads += [n for n in graph.node if n.op_type == "FusedMatMul" and n.input[1] in inits and len(n.input) == 2
              and attr(n, "transB", 0) == 1 and attr(n, "transA", 0) == 0 and attr(n, "transBatchA", 0) == 0
              and attr(n, "transBatchB", 0) == 0]
    if len(heads) != 1:
        return False
    gemm = heads[0]
    weight = numpy_helper.to_array(inits[gemm.input[1]])
    alpha = attr(gemm, "alpha", 1.0)
    head_t = np.ascontiguousarray(weight.T * np.float32(alpha) if alpha != 1.0 else weight.T)
    graph.initializer.append(numpy_helper.from_array(head_t.astype(weight.dtype), HEAD_WEIGHT))
    if len(gemm.input) == 3:   # Gemm's bias broadcasts over rows: the same Add after the MatMul
        replacement = [helper.make_node("MatMul", [gemm.input[0], HEAD_WEIGHT], [f"{gemm.output[0]}.head"],
                                        name="lm_head"),
                       helper.make_node("Add", [f"{gemm.output[0]}.head", gemm.input[2]], list(gemm.output),
                                        name="lm_head.bias")]
    else:
        replacement = [helper.make_node("MatMul", [gemm.input[0], HEAD_WEIGHT], list(gemm.output), name="lm_head")]
    nodes: list[onnx.NodeProto] = []
    for n in graph.node:
        nodes += replacement if n is gemm else [n]
    graph.ClearField("node")
    graph.node.extend(nodes)
    if not any(gemm.input[1] in n.input for n in nodes):   # untied head: its [vocab, hidden] original is unused
        graph.initializer.remove(inits[gemm.input[1]])
    return True


def quantize_graph(model: onnx.ModelProto, bits: int, cfg: WeightQuantConfig) -> tuple[onnx.ModelProto, dict]:
    """The graph with its weight MatMuls as MatMulNBits; returns it and counts of what was quantized."""
    from onnxruntime.quantization.matmul_nbits_quantizer import (DefaultWeightOnlyQuantConfig,
                                                                 HQQWeightOnlyQuantConfig, MatMulNBitsQuantizer)

    if cfg.algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm: {cfg.algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    if cfg.algorithm == "hqq" and bits != 4:
        raise ValueError("algorithm: hqq is offered for 4 bits only")
    model = copy_model(model)   # the caller's graph stays as it was
    head = head_as_matmul(model) if cfg.lm_head_bits else False
    # Block size per weight: the configured one, or for a narrower input (K < block) the largest power of two
    # <= K (MatMulNBits takes 16, 32, 64, 128, 256); narrower than 16 stays fp32.
    plan: dict[tuple[int, int], list[str]] = {}
    for n in model.graph.node:
        k = _k_of(model, n) if n.op_type == "MatMul" else 0
        if k >= MIN_BLOCK:
            block = min(cfg.block_size, 1 << (k.bit_length() - 1))
            nbits = cfg.lm_head_bits if n.name == "lm_head" else bits
            plan.setdefault((nbits, block), []).append(n.name)

    def quantize(graph: onnx.ModelProto, nbits: int, block: int, names: list[str]) -> onnx.ModelProto:
        if cfg.algorithm == "hqq":
            algo = HQQWeightOnlyQuantConfig(block_size=block, bits=nbits)
        else:
            algo = DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=cfg.symmetric,
                                                accuracy_level=cfg.accuracy_level, bits=nbits)
        others = [n.name for n in graph.graph.node if n.op_type == "MatMul" and n.name not in names]
        quantizer = MatMulNBitsQuantizer(graph, nodes_to_exclude=others, algo_config=algo)
        _quiet(quantizer.process)
        return quantizer.model.model

    out = model
    for (nbits, block), names in sorted(plan.items()):   # one pass per (bits, block) group
        out = quantize(out, nbits, block, names)
    if cfg.algorithm == "hqq" and cfg.accuracy_level:   # its quantizer writes no accuracy_level
        for n in out.graph.node:
            if n.op_type == "MatMulNBits":
                n.attribute.append(helper.make_attribute("accuracy_level", cfg.accuracy_level))
    ops = Counter(n.op_type for n in out.graph.node)
    stats = {"MatMulNBits": ops["MatMulNBits"], "MatMul left fp32": ops["MatMul"],
             "lm_head bits": cfg.lm_head_bits if head else 32,
             "blocks": {f"{nbits} bits block {block}": len(names) for (nbits, block), names in sorted(plan.items())}}
    out.graph.name = f"{out.graph.name}-w{bits}"
    return out, stats


def _k_of(model: onnx.ModelProto, node: onnx.NodeProto) -> int:
    for t in model.graph.initializer:
        if t.name == node.input[1]:
            return int(t.dims[0])
    return 1 << 30     # not a weight: the quantizer skips it anyway


def _quiet(fn) -> None:
    """The quantizer logs every node at INFO on its own loggers."""
    names = ("onnxruntime.quantization.matmul_nbits_quantizer", "onnxruntime.quantization")
    levels = [logging.getLogger(n).level for n in names]
    for n in names:
        logging.getLogger(n).setLevel(logging.WARNING)
    try:
        fn()
    finally:
        for n, lvl in zip(names, levels):
            logging.getLogger(n).setLevel(lvl)


def describe(variant: str, quant: dict[int, WeightQuantConfig]) -> dict:
    """model.json `quantization[variant]`: how its weights (and cache) were quantized."""
    bits, kv8 = WEIGHT_VARIANTS[variant]
    return {**quant[bits].as_json(bits), "method": "MatMulNBits", "kv_cache": "int8" if kv8 else "float32"}


def build_variant(variant: str, w, out_dir, quant: dict[int, WeightQuantConfig], kv_scales, calibrated: int):
    """Write `variant`'s graph and mixed twin into out_dir (from the decoder weights `w`); its VariantBuild."""
    from . import decoder_graph
    from .variants import VariantBuild

    bits, kv8 = WEIGHT_VARIANTS[variant]
    cfg = quant[bits]
    plain, mixed = variant_files(variant)
    infos = decoder_graph.export_inplace_transformed(w, out_dir / plain, out_dir / mixed,
                                                     lambda graph: quantize_graph(graph, bits, cfg),
                                                     kv_scales if kv8 else None)
    stats = infos[0]
    notes = [f"MatMulNBits {bits} bits, block {cfg.block_size}, accuracy_level {cfg.accuracy_level}, "
             f"{cfg.algorithm}{' symmetric' if cfg.symmetric and cfg.algorithm == 'rtn' else ''}; "
             f"{stats['MatMulNBits']} weight MatMuls quantized, {stats['MatMul left fp32']} left fp32; LM head "
             + (f"{stats['lm_head bits']} bits" if stats["lm_head bits"] != 32 else "fp32")
             + "; per group: " + ", ".join(f"{g} x{n}" for g, n in stats["blocks"].items())]
    if kv8:
        notes.append(f"int8 cache scales calibrated on {calibrated} tokens")
    return VariantBuild(variant, plain, fused_operators={"MatMulNBits": stats["MatMulNBits"]}, notes=notes)
