"""Whether a row's answer depends on the rows beside it: the weight MatMuls of a decoder step, in each weight format
the in-place decoder's variants use, with one row (a sequence decoding alone) against the same row among others.

    python -m bench batch_rows [--k 768] [--n 2304] [--rows 2,3,8,16,32] [--threads 2]

A seeded draw reads the logits: when a row's logits change in their last bits with the batch's size, the same
request with the same seed can draw another token beside other requests than alone (docs/protocol.md, Seeds).
Formats: fp32 (onnx MatMul, MLAS sgemm) and MatMulNBits of 4 and 8 bits at accuracy levels 0 and 4 (what
export/weights.py writes: block 32, symmetric). Prints, per format, the largest difference between a row computed
alone and the same row in a batch of R rows, and between batches of R and of the largest R.
"""
from __future__ import annotations

import argparse
import logging

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from bench.harness import Benchmark

log = logging.getLogger(__name__)


def _matmul(weight: np.ndarray) -> bytes:
    k, n = weight.shape
    graph = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"])], "rows",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["B", "S", k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["B", "S", n])],
                              [numpy_helper.from_array(weight, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _nbits(weight: np.ndarray, bits: int, accuracy_level: int) -> bytes:
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import (DefaultWeightOnlyQuantConfig,
                                                                 MatMulNBitsQuantizer)

    config = DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=True, accuracy_level=accuracy_level, bits=bits)
    quantizer = MatMulNBitsQuantizer(onnx.load_from_string(_matmul(weight)), algo_config=config)
    quantizer.process()
    return quantizer.model.model.SerializeToString()


def measure(model: bytes, x: np.ndarray, rows: list[int], threads: int) -> dict[str, float]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    widest = session.run(None, {"X": x})[0]
    alone = np.concatenate([session.run(None, {"X": x[i:i + 1]})[0] for i in range(len(x))])
    out = {"alone vs batch": float(np.abs(alone - widest).max())}
    for r in rows:
        out[f"{r} rows vs {len(x)}"] = float(np.abs(session.run(None, {"X": x[:r]})[0] - widest[:r]).max())
    return out


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--k", type=int, default=768, help="input width (a GPT-2-124M layer's)")
    parser.add_argument("--n", type=int, default=2304, help="output width (its fused qkv)")
    parser.add_argument("--rows", default="2,3,8,16", help="batch sizes compared with the largest")
    parser.add_argument("--threads", type=int, default=2)


def run(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((args.k, args.n)) * 0.05).astype(np.float32)
    rows = [int(r) for r in args.rows.split(",")]
    x = rng.standard_normal((max(rows) * 2, 1, args.k)).astype(np.float32)
    formats = {"fp32 MatMul": _matmul(weight)}
    for bits in (4, 8):
        for level in (0, 4):
            formats[f"MatMulNBits {bits} bits, accuracy {level}"] = _nbits(weight, bits, level)
    print(f"onnxruntime {ort.__version__}, K {args.k}, N {args.n}, {args.threads} intra-op threads, "
          f"largest batch {len(x)} rows")
    for name, model in formats.items():
        figures = measure(model, x, rows, args.threads)
        print(f"{name:34s} " + "  ".join(f"{k}: {v:.3g}" for k, v in figures.items()))


BENCHMARK = Benchmark(summary=__doc__, sides=("onnxruntime",), options=options, run=run)
