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
magnitude).

An encoder-decoder's probe (seq2seq_answers) runs its two graphs as the engine does: `feed.input_ids` /
`feed.attention_mask` (a source batch of different lengths) through the encoder, then the decoder on the variant's OWN cross
keys/values for `target.input_ids`: a first call of all its ids but the last (decoder start included) on a zeroed self
cache, then a step of the last reading the cache the first call wrote. `encoder.<variant>` is the encoder's first
output (zero beyond each row's source: padded positions are masked in the decoder), `answer.<variant>` the logits of
both calls, concatenated along the target axis.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from modelpkg import Manifest, Seq2SeqSpec

from .heldout import BUILTIN_TEXTS

log = logging.getLogger(__name__)

PROBE_FILE = "probe.npz"
# A variant here must answer within this fraction of its answer's largest magnitude (at least 1) of what it answered
# at export: float sums in another order differ by far less; a kernel that saturates or drops terms, by far more.
TOLERANCE = 0.01
PROBE_TEXTS = 4        # texts of an encoder's probe batch (padded to the longest: the mask is exercised)
PROBE_TOKENS = 24      # tokens of a decoder's probe prompt
TARGET_TOKENS = 3      # an encoder-decoder's probe target: a first decoder call of all but the last, then one step
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


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = min(2, os.cpu_count() or 1)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def answer(path: Path, feeds: dict[str, np.ndarray], max_length: int) -> np.ndarray:
    session = _session(path)
    first = session.get_outputs()[0].name
    return session.run([first], {**feeds, **zero_cache(session, feeds, max_length)})[0]


def seq2seq_feeds(tokenizer: Tokenizer, spec: Seq2SeqSpec) -> dict[str, np.ndarray]:
    """Sources of different lengths (row i cut to (n - i) / n of PROBE_TOKENS: a padded batch whatever the
    tokenizer) and each row's target: the decoder start token, then the row's first source ids folded into the
    target vocabulary (any ids do: the probe checks numbers, not translations)."""
    cap = min(spec.max_source_length, PROBE_TOKENS)
    rows = [tokenizer.encode(t).ids[:max(1, cap * (PROBE_TEXTS - i) // PROBE_TEXTS)]
            for i, t in enumerate(BUILTIN_TEXTS[:PROBE_TEXTS])]
    ids = np.full((len(rows), max(len(r) for r in rows)), spec.pad_token_id, np.int64)
    mask = np.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = r, 1
    start = np.full((len(rows), 1), spec.decoder_start_token_id, np.int64)
    target = np.concatenate([start, ids[:, :TARGET_TOKENS - 1] % spec.target_vocab_size], axis=1)
    return {"feed.input_ids": ids, "feed.attention_mask": mask, "target.input_ids": target}


def seq2seq_answers(encoder: ort.InferenceSession, decoder: ort.InferenceSession, probe: dict[str, np.ndarray],
                    max_target: int) -> tuple[np.ndarray, np.ndarray]:
    """(the encoder's first output, zeroed beyond each source; the decoder's logits of its two calls)."""
    source = {"input_ids": probe["feed.input_ids"], "attention_mask": probe["feed.attention_mask"]}
    names = [o.name for o in encoder.get_outputs()]
    cross = dict(zip(names, encoder.run(names, source)))
    rows, target = len(source["input_ids"]), probe["target.input_ids"]
    past = {i.name: np.zeros([rows, *(d if isinstance(d, int) else max_target for d in i.shape[1:])],
                             _ONNX_TYPES[i.type]) for i in decoder.get_inputs() if i.name.startswith("past_")}
    outputs = [o.name for o in decoder.get_outputs()]
    logits, done = [], 0
    for width in (target.shape[1] - 1, 1):
        done += width
        feeds = {"input_ids": target[:, done - width:done], "attention_mask": np.ones((rows, done), np.int64),
                 "encoder_attention_mask": source["attention_mask"], **cross, **past}
        out = dict(zip(outputs, decoder.run(outputs, feeds)))
        logits.append(out["logits"])
        past = {name: out[name.replace("past_key_values.", "present.", 1)] for name in past}
    first = cross[names[0]] * source["attention_mask"][:, None, :, None]
    return first, np.concatenate(logits, axis=1)


def _seq2seq_arrays(staging: Path, spec: Seq2SeqSpec, variants: list[str], tokenizer: Tokenizer
                    ) -> dict[str, np.ndarray]:
    probe = seq2seq_feeds(tokenizer, spec)
    arrays = dict(probe)
    for v in variants:
        encoder, decoder = (_session(staging / spec.graphs[v][g]) for g in ("encoder", "decoder"))
        arrays[f"encoder.{v}"], arrays[f"answer.{v}"] = seq2seq_answers(encoder, decoder, probe,
                                                                      spec.max_target_length)
    return arrays


def record(staging: Path, manifest: Manifest, tokenizer: Tokenizer, report: dict) -> None:
    """Writes probe.npz and parity.json's `probe` block for every CPU variant the package keeps."""
    variants = sorted(v for v in manifest.variants if v not in _GPU_ONLY)
    if manifest.encoder_decoder is not None:
        arrays = _seq2seq_arrays(staging, manifest.encoder_decoder, variants, tokenizer)
    else:
        inputs = [t.name for t in manifest.inputs]
        make = decoder_feeds if manifest.cache is not None else encoder_feeds
        feeds = make(tokenizer, inputs, manifest.max_length)
        arrays = {f"feed.{k}": v for k, v in feeds.items()}
        arrays.update({f"answer.{v}": answer(staging / manifest.variants[v], feeds, manifest.max_length)
                       for v in variants})
    with open(staging / PROBE_FILE, "wb") as f:     # the staging dir is published whole, or not at all
        np.savez(f, **arrays)
    report["probe"] = {"file": PROBE_FILE, "variants": variants, "tolerance": TOLERANCE,
                       "what": "each variant's first output on these inputs, on the exporting CPU"}
    log.info("probe: %s answered %s inputs", ", ".join(variants), "x".join(map(str, arrays["feed.input_ids"].shape)))
