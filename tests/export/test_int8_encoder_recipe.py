"""The int8 encoder recipe (export/int8.py) on small graphs run by onnxruntime: the rewrite computes what per-token
int8 quantization means (checked against numpy written here), smoothing leaves the fp32 function unchanged, and
per-token scales keep the ordinary tokens exact where one outlier token ruins per-tensor quantization."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from export import int8

K, H, N = 32, 48, 8


def _two_layer(seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """x[B,T,K] -> MatMul W1 -> Add b1 -> Relu -> MatMul W2 -> y[B,T,N], opset 18 like the exported encoders."""
    rng = np.random.default_rng(seed)
    w = {"W1": rng.normal(0, 0.2, (K, H)).astype(np.float32), "b1": rng.normal(0, 0.1, H).astype(np.float32),
         "W2": rng.normal(0, 0.2, (H, N)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h"]), helper.make_node("MatMul", ["h", "W2"], ["y"])]
    graph = helper.make_graph(nodes, "two_layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "T", K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "T", N])],
                              [numpy_helper.from_array(v, k) for k, v in w.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), w


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _per_token_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per-row symmetric activation scale max|x|/127 (stored as uint8 around 128), per-column weight scale
    max|w|/64 (7-bit codes in [-64, 64]), products summed exactly (float64 holds these integer sums exactly)."""
    xs = np.maximum(np.abs(x).max(axis=-1, keepdims=True), 1e-8) / 127
    xq = np.clip(np.rint(x / xs), -128, 127)                  # QuantizeLinear rounds half to even, as rint
    ws = np.abs(w).max(axis=0) / 64
    wq = np.clip(np.rint(w / ws), -64, 64)
    return (xq @ wq) * xs * ws


def test_rewrite_computes_per_token_int8_as_numpy_does() -> None:
    model, w = _two_layer()
    x = np.random.default_rng(1).normal(0, 1, (3, 5, K)).astype(np.float32)
    assert int8.per_token_int8(model) == 2
    onnx.checker.check_model(model)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMulIntegerToFloat") == 2 and "MatMul" not in ops
    h = np.maximum(_per_token_reference(x, w["W1"]) + w["b1"], 0)
    want = _per_token_reference(h.astype(np.float32), w["W2"])
    got = _run(model, x)
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()


def test_integer_products_are_exact_at_the_extremes_on_any_cpu() -> None:
    """Loud activations (uint8 255) times full-scale weights of one sign: where onnxruntime's x86 kernel adds two
    u8 x s8 products in 16 bits (AVX2, AVX-512 without VNNI), 8-bit weight codes (255 x 127 x 2) saturate it and the
    answer drifts from numpy's; the 7-bit codes (255 x 64 x 2 <= 32767) give numpy's sums on every kernel."""
    rng = np.random.default_rng(5)
    w = np.full((K, N), 0.3, np.float32)
    w[:, 1:] *= rng.uniform(0.5, 1, (K, N - 1)).astype(np.float32)   # column 0: every code at the top
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "one",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", N])],
                              [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert int8.per_token_int8(model) == 1
    codes = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "W/int8"))
    assert np.abs(codes).max() == int8.WEIGHT_LEVELS and 2 * 255 * int8.WEIGHT_LEVELS <= 32767
    x = np.abs(rng.normal(0, 1, (6, K))).astype(np.float32)
    x[:3] = 2.0                                                      # rows whose every code is 127 (uint8 255)
    got, want = _run(model, x), _per_token_reference(x, w)
    assert np.abs(got - want).max() < 1e-5 * np.abs(want).max(), np.abs(got - want).max()


def test_smoothing_keeps_the_fp32_function() -> None:
    model, _ = _two_layer()
    x = np.random.default_rng(2).normal(0, 1, (2, 7, K)).astype(np.float32)
    x[..., 3] *= 40                                             # an outlier channel, as LayerNorm outputs have
    before = _run(model, x)
    maxima = int8.channel_maxima(model, [{"x": x}])
    assert set(maxima) == {"x", "h"} and maxima["x"][3] == np.abs(x[..., 3]).max()
    assert int8.smooth(model, maxima) == 2
    onnx.checker.check_model(model)
    assert np.abs(_run(model, x) - before).max() < 1e-5 * np.abs(before).max()


def test_one_loud_token_spoils_per_tensor_scales_not_per_token_ones() -> None:
    """quantize_dynamic's single activation scale lets the loudest token set every token's step; per-token
    scales keep the quiet tokens' outputs close to fp32."""
    import tempfile
    from pathlib import Path

    from onnxruntime.quantization import QuantType, quantize_dynamic

    model, _ = _two_layer()
    x = np.random.default_rng(3).normal(0, 1, (1, 9, K)).astype(np.float32)
    x[0, 0] *= 300                                              # one token 300x louder than the rest
    want = _run(model, x)
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "m.onnx", Path(tmp) / "q.onnx"
        onnx.save(model, src)
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
        per_tensor = _run(onnx.load(dst), x)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    int8.per_token_int8(rewritten)
    per_token = _run(rewritten, x)
    quiet = np.abs(want[0, 1:]).max()
    err_tensor, err_token = np.abs(per_tensor[0, 1:] - want[0, 1:]).max(), np.abs(per_token[0, 1:] - want[0, 1:]).max()
    assert err_token < 0.02 * quiet < err_tensor, (err_token, err_tensor, quiet)


def test_a_shared_weight_is_neither_smoothed_nor_quantized_twice() -> None:
    """A weight two nodes read (a tied embedding: a Gather and a MatMul; or two MatMuls of different inputs) keeps
    its other users exact: it is left unsmoothed, and quantized once for every MatMul reading it."""
    rng = np.random.default_rng(4)
    table = rng.normal(0, 0.3, (K, K)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"]),
             helper.make_node("MatMul", ["emb", "table"], ["a"]),
             helper.make_node("MatMul", ["x", "table"], ["b"])]
    graph = helper.make_graph(
        nodes, "tied", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["T"]),
                        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", K])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["T", K]) for n in ("emb", "a", "b")],
        [numpy_helper.from_array(table, "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    feeds = {"ids": np.array([0, 3, 7], np.int64), "x": rng.normal(0, 1, (3, K)).astype(np.float32)}
    assert int8.smooth(model, int8.channel_maxima(model, [feeds])) == 0
    assert int8.per_token_int8(model) == 2
    onnx.checker.check_model(model)
    assert sum(i.name == "table/int8" for i in model.graph.initializer) == 1
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    emb, a, b = sess.run(None, feeds)
    assert np.array_equal(emb, table[[0, 3, 7]])
    assert np.abs(a - _per_token_reference(emb, table)).max() < 1e-4 * np.abs(a).max()
    assert np.abs(b - _per_token_reference(feeds["x"], table)).max() < 1e-4 * np.abs(b).max()
