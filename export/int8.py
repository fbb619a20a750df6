"""The int8 encoder variant: SmoothQuant-scaled, per-channel 7-bit weights times per-token int8 activations.

onnxruntime's quantize_dynamic gives a whole activation tensor one scale, so the batch's loudest token sets the
step for every other one; on the trained punctuation tagger that kept too few top-1 predictions equal to fp32's
for the gate. Here each row (token) gets its own scale, computed in the graph per call, and SmoothQuant (Xiao et
al. 2022) first moves the activations' outlier channels into the weights: X W = (X / s)(s W), with
s_j = max|X_j|^a / max|W_j|^(1-a) from calibration text. Chosen by measurement on that tagger: per-token scales
alone already pass the gate, smoothing adds a little agreement, and the graph stays well faster than fp32 though
a little slower than per-tensor int8 (docs/MODELS.md, "int8 that passes"; docs/model-package.md, "Variants").

Each weight MatMul becomes
    Abs -> ReduceMax(last axis) -> scale = max / 127     (per row, computed once per input the MatMuls share)
    QuantizeLinear(x, scale, 128), one block per row      -> uint8 (opset 21 blocked quantization)
    MatMulIntegerToFloat(xq, Wq, 1, w_scale, 128)         -> float, per-column weight scales applied
    Mul(row scale)
and the bias Add stays where it was (MatMulIntegerToFloat's bias would be scaled by the row scale after it).

The weights are 7-bit codes in [-64, 64] stored as int8 (WEIGHT_LEVELS), so that the integer sums do not depend on the
CPU: onnxruntime's x86 kernels multiply the uint8 activations (0..255) by the int8 weights, and without VNNI or AMX
(AVX2, AVX-512 without VNNI) they add each pair of adjacent products in 16 bits with saturation (vpmaddubsw). Full
int8 codes overflow there (255 x 127 x 2 > 32767: a wrong sum, not a rounding); 255 x 64 x 2 does not, and VNNI, AMX
and the U8U8 kernels are exact for any codes. Weights stored as uint8 around 128 (the U8U8 kernels, which widen to 16
bits before multiplying) would keep the 8-bit codes but run slower; 7 bits keep the fast kernels for a little
agreement (bench/FINDINGS.md, "int8 weights of 7 bits"; `python -m bench int8_formats`)."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from tokenizers import Tokenizer

from .heldout import calibration_texts

log = logging.getLogger(__name__)

ALPHA = 0.5                  # SmoothQuant's migration strength: the best agreement of those tried (docs/MODELS.md)
SCALE_RANGE = (1e-2, 1e2)    # smoothing factors are clipped: a dead channel must not blow a weight row up
QUANT_OPSET = 21             # QuantizeLinear's block_size (per-row activation scales)
WEIGHT_LEVELS = 64           # weight codes in [-64, 64]: exact integer products on every x86 kernel (module doc)
Feeds = dict[str, np.ndarray]


def weight_matmuls(model: onnx.ModelProto) -> list[int]:
    """Indices of the MatMuls whose second input is a 2-D initializer: the layers that carry weights (attention's
    Q.K and P.V products multiply two activations and stay fp32)."""
    inits = {i.name: i for i in model.graph.initializer}
    return [k for k, n in enumerate(model.graph.node)
            if n.op_type == "MatMul" and n.input[1] in inits and len(inits[n.input[1]].dims) == 2]


def channel_maxima(model: onnx.ModelProto, feeds: list[Feeds]) -> dict[str, np.ndarray]:
    """max |x_j| per channel of every weight MatMul's input over the calibration feeds (one fp32 run each)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    names = sorted({probe.graph.node[k].input[0] for k in weight_matmuls(probe)})
    probe.graph.output.extend(helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, None) for x in names)
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    wanted = {i.name for i in sess.get_inputs()}
    maxima = {x: np.zeros(0, np.float32) for x in names}
    for f in feeds:
        for x, out in zip(names, sess.run(names, {k: v for k, v in f.items() if k in wanted})):
            m = np.abs(out).reshape(-1, out.shape[-1]).max(axis=0)
            maxima[x] = m if maxima[x].size == 0 else np.maximum(maxima[x], m)
    return maxima


def smooth(model: onnx.ModelProto, maxima: dict[str, np.ndarray], alpha: float = ALPHA) -> int:
    """Scale each weight MatMul input down per channel and its weights' rows up by the same factors (the product
    is unchanged in exact arithmetic); returns how many inputs were smoothed. MatMuls sharing an input (Q, K, V)
    share its factors."""
    inits = {i.name: i for i in model.graph.initializer}
    uses = _uses(model)
    users: dict[str, list[int]] = {}
    for k in weight_matmuls(model):
        users.setdefault(model.graph.node[k].input[0], []).append(k)
    placed: list[tuple[int, onnx.NodeProto]] = []
    for x, at in users.items():
        nodes = [model.graph.node[k] for k in at]
        if any(uses[n.input[1]] > 1 for n in nodes):   # a shared (tied) weight: scaling it would change its
            continue                                   # other users (an embedding lookup, another layer)
        w_max = np.max([np.abs(numpy_helper.to_array(inits[n.input[1]])).max(axis=1) for n in nodes], axis=0)
        s = np.clip(maxima[x] ** alpha / np.maximum(w_max, 1e-5) ** (1 - alpha), *SCALE_RANGE).astype(np.float32)
        for node in nodes:
            w = numpy_helper.to_array(inits[node.input[1]]) * s[:, None]
            inits[node.input[1]].CopyFrom(numpy_helper.from_array(w.astype(np.float32), node.input[1]))
            node.input[0] = x + "/smoothed"
        model.graph.initializer.append(numpy_helper.from_array(1 / s, x + "/inverse_smoothing"))
        mul = helper.make_node("Mul", [x, x + "/inverse_smoothing"], [x + "/smoothed"], name=x + "/smooth")
        placed.append((min(at), mul))
    _insert_before(model, placed)
    return len(placed)


def quantize_weight(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A [K, N] weight as int8 codes in [-WEIGHT_LEVELS, WEIGHT_LEVELS] (7 bits, module doc) and one float scale
    per output column (max |w| of the column / WEIGHT_LEVELS)."""
    scale = (np.maximum(np.abs(w).max(axis=0), 1e-12) / WEIGHT_LEVELS).astype(np.float32)
    return np.clip(np.round(w / scale), -WEIGHT_LEVELS, WEIGHT_LEVELS).astype(np.int8), scale


def per_token_int8(model: onnx.ModelProto) -> int:
    """Rewrite every weight MatMul as per-token uint8 activations x per-channel 7-bit weights (module doc);
    returns how many were rewritten."""
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    targets = set(weight_matmuls(model))
    shared = {"axes": np.array([-1], np.int64), "eps": np.array(1e-8, np.float32),
              "inv127": np.array(1 / 127, np.float32), "one": np.array(1.0, np.float32),
              "zero_point": np.array(128, np.uint8)}
    g.initializer.extend(numpy_helper.from_array(v, f"int8/{k}") for k, v in shared.items())
    quantized: dict[str, tuple[str, str]] = {}    # input -> (its uint8 tensor, its row scales)
    weights: set[str] = set()                      # weights already quantized
    nodes: list[onnx.NodeProto] = []
    for k, node in enumerate(g.node):
        if k not in targets:
            nodes.append(node)
            continue
        x, name = node.input[0], node.input[1]
        w = numpy_helper.to_array(inits[name]).astype(np.float32)
        if name not in weights:    # a weight two MatMuls share is quantized once
            codes, w_scale = quantize_weight(w)
            g.initializer.extend([numpy_helper.from_array(codes, name + "/int8"),
                                  numpy_helper.from_array(w_scale, name + "/scale")])
            weights.add(name)
        if x not in quantized:
            p = x + "/int8"
            nodes += [
                helper.make_node("Abs", [x], [p + "/abs"]),
                helper.make_node("ReduceMax", [p + "/abs", "int8/axes"], [p + "/max"], keepdims=1),
                helper.make_node("Max", [p + "/max", "int8/eps"], [p + "/max_eps"]),
                helper.make_node("Mul", [p + "/max_eps", "int8/inv127"], [p + "/scale"]),
                helper.make_node("Shape", [p + "/scale"], [p + "/scale_shape"]),
                helper.make_node("Expand", ["int8/zero_point", p + "/scale_shape"], [p + "/zero_point"]),
                helper.make_node("QuantizeLinear", [x, p + "/scale", p + "/zero_point"], [p + "/q"], axis=-1,
                                 block_size=w.shape[0]),
            ]
            quantized[x] = (p + "/q", p + "/scale")
        xq, row_scale = quantized[x]
        nodes += [
            helper.make_node("MatMulIntegerToFloat", [xq, name + "/int8", "int8/one", name + "/scale",
                                                      "int8/zero_point"], [node.output[0] + "/unscaled"],
                             domain="com.microsoft", name=(node.name or node.output[0]) + "/int8"),
            helper.make_node("Mul", [node.output[0] + "/unscaled", row_scale], [node.output[0]]),
        ]
    del g.node[:]
    g.node.extend(nodes)
    used = {i for n in g.node for i in n.input}
    kept = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(kept)
    _require_opsets(model)
    return len(targets)


def calibration_feeds(tokenizer: Tokenizer, max_length: int, texts: list[str] | None = None) -> list[Feeds]:
    """One unpadded batch-1 feed per calibration text (padding would add the pad token's activations)."""
    feeds = []
    for text in texts if texts is not None else calibration_texts():
        enc = tokenizer.encode(text)
        ids = np.array([enc.ids[:max_length]], np.int64)
        feeds.append({"input_ids": ids, "attention_mask": np.ones_like(ids),
                      "token_type_ids": np.array([enc.type_ids[:max_length]], np.int64)})
    return feeds


def build(fp32: Path, out: Path, calibration: list[Feeds], alpha: float = ALPHA) -> list[str]:
    """Write the int8 graph of `fp32` to `out`; returns the build notes recorded in the package."""
    model = onnx.load(str(fp32))
    maxima = channel_maxima(model, calibration)
    smoothed = smooth(model, maxima, alpha)
    n = per_token_int8(model)
    onnx.checker.check_model(model)
    tmp = out.with_name(out.name + ".tmp")
    onnx.save(model, str(tmp))
    tmp.replace(out)
    log.info("int8: %d weight MatMuls, %d inputs smoothed (alpha %.2f, %d calibration texts)", n, smoothed, alpha,
             len(calibration))
    return [f"SmoothQuant alpha {alpha} over {len(calibration)} calibration texts ({smoothed} MatMul inputs)",
            f"{n} weight MatMuls: per-channel 7-bit weights (int8 codes in [-{WEIGHT_LEVELS}, {WEIGHT_LEVELS}]), "
            "per-token uint8 activations (MatMulIntegerToFloat)"]


def _uses(model: onnx.ModelProto) -> dict[str, int]:
    """How many node inputs read each tensor name (graph outputs not counted)."""
    uses: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    return uses


def _insert_before(model: onnx.ModelProto, placed: list[tuple[int, onnx.NodeProto]]) -> None:
    """Insert each node just before the node at its index (keeps the graph topologically sorted)."""
    at: dict[int, list[onnx.NodeProto]] = {}
    for i, node in placed:
        at.setdefault(i, []).append(node)
    nodes = []
    for i, node in enumerate(model.graph.node):
        nodes += at.get(i, [])
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _require_opsets(model: onnx.ModelProto) -> None:
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version < QUANT_OPSET:
            opset.version = QUANT_OPSET
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
