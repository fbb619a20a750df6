"""The int8 variants' weight formats (export/int8.py) on this machine's CPU: which integer products are exact, and
what each format costs in agreement with fp32 and in time.

    python -m bench int8_formats [--package DIR] [--seq2seq]

onnxruntime's x86 integer GEMM multiplies uint8 activations by int8 weights. Without VNNI / AMX (AVX2, AVX-512
without VNNI) it adds each pair of adjacent u8 x s8 products in 16 bits (vpmaddubsw), which saturates past 32767:
255 x 127 x 2 does, 255 x 64 x 2 does not. The formats compared:
  s8  codes in [-127, 127]: the recipe before this check; exact only where the CPU has VNNI or AMX;
  s7  codes in [-64, 64] (export/int8.py's WEIGHT_LEVELS): the same kernels, exact on every x86 kernel;
  u8  s8's codes stored as uint8 around 128: onnxruntime's U8U8 kernels, which widen to 16 bits before
      multiplying (exact), with s8's numbers.
Pieces:
  exact     one MatMulInteger per format on worst-case and random activations against numpy's int64 product, and
            the time of one weight MatMul of MiniLM's shape (384 x 1536) per format and row count;
  package   (--package: an encoder package's dir with model.onnx and tokenizer.json) the int8 rewrite, SmoothQuant
            included, in each format: top-1 agreement with the fp32 graph over the gate's held-out sentences
            (export/heldout.BUILTIN_TEXTS, batches of 16 as the gate runs them) and the time of a batch of 8;
  seq2seq   (--seq2seq) the random Marian of tests/export/test_seq2seq_int8_variant.py exported with the int8
            variant in each format: the gate's figures (identical outputs, perplexity ratio) and step times.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from bench.harness import Benchmark

FORMATS = ("s8", "s7", "u8")
LEVELS = {"s8": 127, "s7": 64, "u8": 127}
ROWS = (1, 64, 512)
SHAPE = (384, 1536)


def codes(w: np.ndarray, fmt: str) -> tuple[np.ndarray, int]:
    """`w`'s per-column codes in `fmt` and their zero point (the integers the kernel multiplies)."""
    levels = LEVELS[fmt]
    q = np.clip(np.round(w / (np.abs(w).max(axis=0) / levels)), -levels, levels)
    return ((q + 128).astype(np.uint8), 128) if fmt == "u8" else (q.astype(np.int8), 0)


def _session(model: onnx.ModelProto, threads: int = 1) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _matmul_integer(q: np.ndarray, zero_point: int) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(q, "w"), numpy_helper.from_array(np.array(zero_point, q.dtype), "w_zero"),
             numpy_helper.from_array(np.array(128, np.uint8), "x_zero")]
    graph = helper.make_graph([helper.make_node("MatMulInteger", ["x", "w", "x_zero", "w_zero"], ["y"])], "mmi",
                              [helper.make_tensor_value_info("x", TensorProto.UINT8, ["M", q.shape[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, ["M", q.shape[1]])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _best_ms(run, repeat: int = 5, at_least_s: float = 0.2) -> float:
    run()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < at_least_s / repeat:
        run()
        n += 1
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            run()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e3


def exact_piece() -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.05, SHAPE).astype(np.float32)
    w[:, 0] = 0.05                                      # a column whose codes all sit at +levels
    w[::2, 1], w[1::2, 1] = -0.05, 0.05                 # and one at -levels, +levels alternately
    loud = np.full((2, SHAPE[0]), 255, np.uint8)        # activations at the top of uint8
    print(f"onnxruntime {ort.__version__}; exactness against numpy's int64 product, ms per MatMul {SHAPE}")
    for fmt in FORMATS:
        q, zp = codes(w, fmt)
        sess = _session(_matmul_integer(q, zp))
        wanted = q.astype(np.int64) - zp
        cells = []
        for name, x in (("worst", loud), ("random", rng.integers(0, 256, (64, SHAPE[0]), dtype=np.uint8))):
            got = sess.run(None, {"x": x})[0]
            cells.append(f"{name} {'exact' if np.array_equal(got, (x.astype(np.int64) - 128) @ wanted) else 'WRONG'}"
                         f" (max |diff| {int(np.abs(got - (x.astype(np.int64) - 128) @ wanted).max())})")
        times = []
        for rows in ROWS:
            x = rng.integers(0, 256, (rows, SHAPE[0]), dtype=np.uint8)
            times.append(f"{rows} rows {_best_ms(lambda: sess.run(None, {'x': x})):.3f}")
        print(f"  {fmt}: {'; '.join(cells)}; ms: {', '.join(times)}")


@contextlib.contextmanager
def weight_format(fmt: str) -> Iterator[None]:
    """export/int8.py's rewrite writing `fmt`'s weights (u8: s8's codes moved to uint8 around 128 afterwards)."""
    from export import int8, seq2seq_quantized

    rewrite = int8.per_token_int8

    def per_token(model: onnx.ModelProto) -> int:
        n = rewrite(model)
        if fmt == "u8":
            _to_u8(model)
        return n

    with mock.patch.object(int8, "WEIGHT_LEVELS", LEVELS[fmt]), mock.patch.object(int8, "per_token_int8", per_token), \
            mock.patch.object(seq2seq_quantized, "per_token_int8", per_token):
        yield


def _to_u8(model: onnx.ModelProto) -> None:
    g = model.graph
    for init in g.initializer:
        if init.data_type == TensorProto.INT8 and init.name.endswith("/int8"):
            init.CopyFrom(numpy_helper.from_array((numpy_helper.to_array(init).astype(np.int16) + 128)
                                                  .astype(np.uint8), init.name))
    g.initializer.append(numpy_helper.from_array(np.array(128, np.uint8), "int8/weight_zero_point"))
    for node in g.node:
        if node.op_type == "MatMulIntegerToFloat":
            node.input.append("int8/weight_zero_point")


def _feeds(package: Path, names: list[str], texts: list[str]) -> dict[str, np.ndarray]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(package / "tokenizer.json"))
    encs = tok.encode_batch(texts)
    width = max(len(e.ids) for e in encs)
    pad = tok.token_to_id("[PAD]") or 0
    feeds = {"input_ids": np.full((len(encs), width), pad, np.int64),
             "attention_mask": np.zeros((len(encs), width), np.int64),
             "token_type_ids": np.zeros((len(encs), width), np.int64)}
    for r, e in enumerate(encs):
        feeds["input_ids"][r, :len(e.ids)] = e.ids
        feeds["attention_mask"][r, :len(e.ids)] = 1
    return {k: v for k, v in feeds.items() if k in names}


def _plain(text: str) -> str:
    """A passage as the punctuation restorer reads it: lowercased, without punctuation."""
    return " ".join("".join(c for c in word if c.isalnum() or c == "'") for word in text.lower().split())


def package_piece(package: Path, n_passages: int = 0, rounds: int = 7) -> None:
    from tokenizers import Tokenizer

    from export import int8
    from export.heldout import BUILTIN_TEXTS

    sessions = {"fp32": _session(onnx.load(str(package / "model.onnx")), threads=2)}
    names = [i.name for i in sessions["fp32"].get_inputs()]
    texts = list(BUILTIN_TEXTS)
    sets = {"the gate's sentences": texts}
    if n_passages:
        from bench.material import passages

        more = passages(n_passages, 24)
        sets[f"{n_passages} corpus passages, half plain"] = [_plain(t) if i % 2 else t for i, t in enumerate(more)]
    batches = {k: [_feeds(package, names, v[i:i + 16]) for i in range(0, len(v), 16)] for k, v in sets.items()}
    refs = {k: [sessions["fp32"].run(None, f)[0] for f in b] for k, b in batches.items()}
    calibration = int8.calibration_feeds(Tokenizer.from_file(str(package / "tokenizer.json")), 512)
    print(f"{package}: top-1 agreement with the fp32 graph ({' / '.join(sets)})")
    for fmt in FORMATS:
        with tempfile.TemporaryDirectory() as tmp, weight_format(fmt):
            out = Path(tmp) / "model.int8.onnx"
            int8.build(package / "model.onnx", out, calibration)
            sessions[fmt] = sess = _session(onnx.load(str(out)), threads=2)
        print(f"  {fmt}: " + " / ".join(_agreement(sess, batches[k], refs[k]) for k in sets))
    # Time the graphs in alternating rounds (a shared machine's load falls on all of them alike); medians.
    timed = _feeds(package, names, texts[:8])
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for _ in range(rounds):
        for k, sess in sessions.items():
            times[k].append(_best_ms(lambda: sess.run(None, timed), repeat=3))
    print(f"  ms per batch of 8 (2 threads), median of {rounds} alternating rounds: "
          + ", ".join(f"{k} {np.median(v):.2f}" for k, v in times.items()))


def _agreement(sess: ort.InferenceSession, batches: list[dict[str, np.ndarray]], refs: list[np.ndarray]) -> str:
    agree = total = 0
    for f, ref in zip(batches, refs):
        got = sess.run(None, f)[0]
        sel = f["attention_mask"].astype(bool) if got.ndim == 3 else np.ones(len(got), bool)
        agree += int((got.argmax(-1) == ref.argmax(-1))[sel].sum())
        total += int(sel.sum())
    return f"{agree}/{total} = {agree / total:.4f}"


def seq2seq_piece() -> None:
    import torch

    from export import ExportConfig, export_checkpoint
    from testing.seq2seq_checkpoints import write_checkpoint

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_checkpoint("marian", Path(tmp) / "marian")
        print("random Marian (tests/export/test_seq2seq_int8_variant.py), the gate's int8 figures")
        for fmt in FORMATS:
            with weight_format(fmt):
                pkg = export_checkpoint(ExportConfig(checkpoint=ckpt, task="generate", repository=Path(tmp) / fmt,
                                                     name="marian", variants=("fp32", "int8"))).package_dir
            parity = json.loads((pkg / "parity.json").read_text())["variants"]
            r = parity["int8"]
            checks = "; ".join(f"{c['name'].split(' (')[0]} {c['value']:.4f}" for c in r["checks"] if "value" in c)
            print(f"  {fmt}: passed {r['passed']}; {checks}; step ms {r.get('step_ms')} (fp32 "
                  f"{parity['fp32'].get('step_ms')})")


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--package", type=Path, default=None, help="an encoder package dir (model.onnx, tokenizer.json)")
    p.add_argument("--passages", type=int, default=0, help="with --package: also judge N corpus passages")
    p.add_argument("--seq2seq", action="store_true", help="also export the random Marian in each format")


def cli(a: argparse.Namespace) -> None:
    exact_piece()
    if a.package is not None:
        package_piece(a.package, a.passages)
    if a.seq2seq:
        seq2seq_piece()


BENCHMARK = Benchmark(summary=__doc__, sides=("onnxruntime",), options=options, run=cli)
