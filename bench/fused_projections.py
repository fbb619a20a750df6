"""Fused q|k|v and gate|up projections against separate ones, on this machine's CPU (issue 39, Phi-3).

    python -m bench.fused_projections [--hidden 3072 --kv-hidden 3072 --inner 8192 --layers 2 --rounds 7]

Phi-3 stores q|k|v as one `qkv_proj` and gate|up as one `gate_up_proj`; Llama / Qwen store them apart. The in-place
decoder graph (export/decoder_graph.py) packs every family's into one MatMul each and splits the outputs. This
times exactly that choice: a chain of layers whose projections are one MatMul + Split, against the same weights as
separate MatMuls (the parts summed / gated and brought back to the hidden width by a shared down MatMul, identical
in both), at the rows of a decode step (1, 8 sequences) and of a prompt chunk (64). onnxruntime's full
optimization, 2 intra-op threads, the fastest of alternating rounds (and the medians). Prints one line per shape;
figures go to bench/FINDINGS.md.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ROWS = (1, 8, 64)


def _graph(fused: bool, hidden: int, kv_hidden: int, inner: int, layers: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"

    def weight(name: str, shape: tuple[int, int]) -> np.ndarray:
        w = (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
        inits.append(numpy_helper.from_array(w, name))
        return w

    def project(i: int, kind: str, inp: str, widths: list[int]) -> list[str]:
        outs = [f"{kind}{i}_{j}" for j in range(len(widths))]
        full = weight(f"{kind}{i}.w", (hidden, sum(widths)))   # the same numbers in both graphs
        if fused:
            split = numpy_helper.from_array(np.array(widths, np.int64), f"{kind}{i}.split")
            inits.append(split)
            nodes.append(helper.make_node("MatMul", [inp, f"{kind}{i}.w"], [f"{kind}{i}"]))
            nodes.append(helper.make_node("Split", [f"{kind}{i}", split.name], outs, axis=-1))
        else:
            inits.pop()
            edges = np.cumsum([0, *widths])
            for j in range(len(widths)):
                inits.append(numpy_helper.from_array(np.ascontiguousarray(full[:, edges[j]:edges[j + 1]]),
                                                     f"{kind}{i}.w{j}"))
                nodes.append(helper.make_node("MatMul", [inp, f"{kind}{i}.w{j}"], [outs[j]]))
        return outs

    for i in range(layers):
        q, k, v = project(i, "qkv", x, [hidden, kv_hidden, kv_hidden])
        nodes.append(helper.make_node("Add", [q, k] if kv_hidden == hidden else [q, q], [f"qk{i}"]))
        nodes.append(helper.make_node("Add", [f"qk{i}", v] if kv_hidden == hidden else [f"qk{i}", q], [f"a{i}"]))
        gate, up = project(i, "gu", f"a{i}", [inner, inner])
        nodes.append(helper.make_node("Mul", [gate, up], [f"m{i}"]))
        weight(f"down{i}.w", (inner, hidden))
        x = f"x{i + 1}"
        nodes.append(helper.make_node("MatMul", [f"m{i}", f"down{i}.w"], [x]))
    graph = helper.make_graph(nodes, "projections", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                    ["rows", hidden])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["rows", hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model.SerializeToString()


def _session(blob: bytes, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])


def _time(sess: ort.InferenceSession, x: np.ndarray, runs: int) -> float:
    sess.run(None, {"x": x})
    t0 = time.perf_counter()
    for _ in range(runs):
        sess.run(None, {"x": x})
    return (time.perf_counter() - t0) / runs * 1e3


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=3072)      # Phi-3-mini's sizes
    ap.add_argument("--kv-hidden", type=int, default=3072)
    ap.add_argument("--inner", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    sessions = {f: _session(_graph(f, a.hidden, a.kv_hidden, a.inner, a.layers), a.threads) for f in (True, False)}
    x = {r: np.random.default_rng(r).standard_normal((r, a.hidden)).astype(np.float32) for r in ROWS}
    want = {r: sessions[True].run(None, {"x": x[r]})[0] for r in ROWS}
    for r in ROWS:   # the same weights, split or not: the same numbers
        got = sessions[False].run(None, {"x": x[r]})[0]
        assert np.allclose(got, want[r], rtol=1e-3, atol=1e-3 * float(np.abs(want[r]).max())), "graphs differ"
    for r in ROWS:
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(a.rounds):
            for f in (True, False):
                times[f].append(_time(sessions[f], x[r], a.runs))
        # the fastest round is the least disturbed by other work on a shared machine; the median shows the spread
        fused, split = min(times[True]), min(times[False])
        print(f"rows {r:3d}: fastest fused {fused:8.3f} ms  split {split:8.3f} ms  split/fused {split / fused:.3f}"
              f"   (medians {statistics.median(times[True]):.3f} / {statistics.median(times[False]):.3f})")


if __name__ == "__main__":
    main()
