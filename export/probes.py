"""Each variant's answer to a few inputs, kept in the package (probe.npz) so that the server can check, on the CPU
where it serves, that the variant computes what it computed where its gate passed (docs/model-package.md, "Probe").

Why: a verdict is measured on the exporting machine's kernels. onnxruntime picks CPU kernels at run time (AVX2,
AVX-512, VNNI, AMX), and where they differ in more than rounding a verdict does not carry over (an 8-bit integer
product saturating without VNNI did: bench/FINDINGS.md, "int8 weights of 7 bits"). Re-running the gate where the
server runs would need the checkpoint and torch; the variant's own answers to the probe are enough to tell whether
this CPU computes the same numbers.

The file holds `feed.<input>` for every graph input but the cache (a decoder's past buffers start as zeros: the
server makes them from the graph's input shapes) and `answer.<variant>` (the graph's first output). parity.json's
`probe` block names the file, the variants it covers and the tolerance (a fraction of the answer's largest
magnitude). Encoder-decoders have none: their decoder graph needs the encoder's keys, which the engine makes.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from modelpkg import Manifest

from .heldout import BUILTIN_TEXTS

log = logging.getLogger(__name__)

PROBE_FILE = "probe.npz"
# A variant here must answer within this fraction of its answer's largest magnitude (at least 1) of what it answered
# at export: float sums in another order differ by far less; a kernel that saturates or drops terms, by far more.
TOLERANCE = 0.01
PROBE_TEXTS = 4        # texts of an encoder's probe batch (padded to the longest: the mask is exercised)
PROBE_TOKENS = 24      # tokens of a decoder's probe prompt
_GPU_ONLY = ("fp16",)
_ONNX_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int8)": np.int8,
               "tensor(uint8)": np.uint8, "tensor(int64)": np.int64, "tensor(int32)": np.int32}


def encoder_feeds(tokenizer: Tokenizer, input_names: list[str], max_length: int) -> dict[str, np.ndarray]:
    rows = [tokenizer.encode(t).ids[:max_length] for t in BUILTIN_TEXTS[:PROBE_TEXTS]]
    width = max(len(r) for r in rows)
    ids = np.zeros((len(rows), width), np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = r, 1
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    return {n: feeds[n] for n in input_names}


def decoder_feeds(tokenizer: Tokenizer, input_names: list[str], max_length: int) -> dict[str, np.ndarray]:
    """One first prompt (no past): what every in-place graph takes besides its cache buffers."""
    ids = tokenizer.encode(" ".join(BUILTIN_TEXTS[:4])).ids[:min(PROBE_TOKENS, max_length)]
    n = len(ids)
    feeds = {"input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, n), np.int64),
             "position_ids": np.arange(n, dtype=np.int64)[None]}
    return {name: feeds[name] for name in input_names if name in feeds}


def zero_cache(session: ort.InferenceSession, feeds: dict[str, np.ndarray], max_length: int) -> dict[str, np.ndarray]:
    """Zeros for every input not in `feeds` (a decoder's past buffers), one row, `max_length` positions."""
    zeros = {}
    for given in session.get_inputs():
        if given.name not in feeds:
            shape = [1 if i == 0 else d if isinstance(d, int) else max_length for i, d in enumerate(given.shape)]
            zeros[given.name] = np.zeros(shape, _ONNX_TYPES[given.type])
    return zeros


def answer(path: Path, feeds: dict[str, np.ndarray], max_length: int) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = min(2, os.cpu_count() or 1)
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    first = session.get_outputs()[0].name
    return session.run([first], {**feeds, **zero_cache(session, feeds, max_length)})[0]


def record(staging: Path, manifest: Manifest, tokenizer: Tokenizer, report: dict) -> None:
    """Writes probe.npz and parity.json's `probe` block for every CPU variant the package keeps."""
    if manifest.encoder_decoder is not None:
        return
    inputs = [t.name for t in manifest.inputs]
    make = decoder_feeds if manifest.cache is not None else encoder_feeds
    feeds = make(tokenizer, inputs, manifest.max_length)
    answers = {v: answer(staging / f, feeds, manifest.max_length)
               for v, f in manifest.variants.items() if v not in _GPU_ONLY}
    arrays = {**{f"feed.{k}": v for k, v in feeds.items()}, **{f"answer.{v}": a for v, a in answers.items()}}
    with open(staging / PROBE_FILE, "wb") as f:     # the staging dir is published whole, or not at all
        np.savez(f, **arrays)
    report["probe"] = {"file": PROBE_FILE, "variants": sorted(answers), "tolerance": TOLERANCE,
                       "what": "each variant's first output on these inputs, on the exporting CPU"}
    log.info("probe: %s answered %s inputs", ", ".join(sorted(answers)), "x".join(map(str, feeds["input_ids"].shape)))
