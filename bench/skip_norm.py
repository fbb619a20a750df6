"""onnxruntime's fused residual norms against their parts, on this machine's CPU.

    python -m bench skip_norm

Times 20 chained SkipLayerNormalization nodes against 20 x (Add + LayerNormalization), and the RMSNorm pair
(SkipSimplifiedLayerNormalization against Add + RMSNormalization), at the shapes ortserve's graphs run: a decode
step's rows (1 and 32 x 768), a g2p batch (640 x 128), a MiniLM batch of 8 passages (440 x 384). Each graph with
onnxruntime's full optimization, spinning, default threads: the answer decides how export/decoder_graph.py,
export/seq2seq_graph.py and export/variants.py write the residual norms ("Residual norms" in decoder_graph.py).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from bench.harness import Benchmark

SHAPES = ((1, 768), (32, 768), (640, 128), (440, 384))
CHAIN = 20


def _graph(fused: bool, rms: bool, width: int) -> bytes:
    nodes, x = [], "x"
    for i in range(CHAIN):
        y = f"y{i}"
        if fused:
            op = "SkipSimplifiedLayerNormalization" if rms else "SkipLayerNormalization"
            nodes.append(helper.make_node(op, [x, "r", "g"] + ([] if rms else ["b"]), [y], domain="com.microsoft",
                                          epsilon=1e-5))
        else:
            nodes.append(helper.make_node("Add", [x, "r"], [f"s{i}"]))
            norm = ("RMSNormalization", [f"s{i}", "g"]) if rms else ("LayerNormalization", [f"s{i}", "g", "b"])
            nodes.append(helper.make_node(norm[0], norm[1], [y], axis=-1, epsilon=1e-5))
        x = y
    inits = [numpy_helper.from_array(np.ones(width, np.float32), "g")]
    if not rms:
        inits.append(numpy_helper.from_array(np.zeros(width, np.float32), "b"))
    graph = helper.make_graph(nodes, "norms", [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", width])
                                               for n in ("x", "r")],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["N", width])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23),
                                                   helper.make_opsetid("com.microsoft", 1)]).SerializeToString()


def per_node_us(fused: bool, rms: bool, rows: int, width: int, runs: int = 200) -> float:
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    # The unfused pair must stay a pair: the server turns the same fusion off (server/sessions.py).
    session = ort.InferenceSession(_graph(fused, rms, width), options, providers=["CPUExecutionProvider"],
                                   disabled_optimizers=["SkipLayerNormFusion"])
    rng = np.random.default_rng(0)
    feeds = {n: rng.normal(size=(rows, width)).astype(np.float32) for n in ("x", "r")}
    for _ in range(20):
        session.run(None, feeds)
    t0 = time.perf_counter()
    for _ in range(runs):
        session.run(None, feeds)
    return (time.perf_counter() - t0) / runs / CHAIN * 1e6


def options(p: argparse.ArgumentParser) -> None:
    """No options of its own."""


def cli(a: argparse.Namespace) -> None:
    print(f"onnxruntime {ort.__version__}; us per residual norm, {CHAIN} chained")
    heads = ("rows x width", "SkipLayerNorm", "Add+LayerNorm", "SkipSimplified", "Add+RMSNorm")
    print(f"{heads[0]:>14} " + " ".join(f"{h:>14}" for h in heads[1:]))
    for rows, width in SHAPES:
        cells = [per_node_us(fused, rms, rows, width) for rms in (False, True) for fused in (True, False)]
        print(f"{rows:>6} x {width:<5} " + " ".join(f"{c:>14.1f}" for c in cells))


BENCHMARK = Benchmark(summary=__doc__, sides=("onnxruntime",), options=options, run=cli)
