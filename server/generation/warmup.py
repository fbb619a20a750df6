"""The engine's warm-up at load: every kind of run serving will make, and the edges requests may reach.

Run at full width, so onnxruntime sizes its buffers now, not during the first requests. A model.json claiming more
than the graph holds (its vocabulary, its context, an encoder-decoder's source side) fails here, with a ValueError
naming the field, instead of inside every request that gets there.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .encoder_step import EncodeRow
from .runner import Runner
from .seq2seq_spec import SourceSpec
from .slot_runner import DecodeRow, PrefillRow
from .spec import DecoderSpec


def warm_up(runner: Runner, spec: DecoderSpec, source: SourceSpec | None, chunk_tokens: int,
            label: str) -> None:
    """A two-row first prompt, a continuation chunk, a decode step over every slot with a hole, and the mixed
    graph's decode + chunk; then the edges. Raises on any failure; the slots' contents do not matter afterwards
    (every position is written before it is read)."""
    start = next((t for t in (spec.bos_id, spec.eos_id) if t is not None), 0)
    if source is not None:
        start = source.start_id
        _warm_source(runner, spec, source)
    r, n = runner, runner.num_slots
    chunk = max(1, min(chunk_tokens, spec.max_length // 2))
    pair = [PrefillRow(0, [start] * chunk, 0)] + ([PrefillRow(1, [start], 0)] if n > 1 else [])
    _check_logits(r.prefill(pair, first_prompt=True)[:, 0], len(pair), "prefill", spec)
    more = r.prefill([PrefillRow(0, [start] * 2, chunk)], first_prompt=False)
    _check_logits(more[:, -1], 1, "prefill chunk", spec)
    rows = [DecodeRow(slot, start, 1) for slot in range(n) if slot != 1 or n == 1]
    _check_logits(r.decode(rows, {1: 1}), len(rows), "step", spec)   # slot 1 sits in the range, idle
    if r.mixed_session is not None:
        dec, pre = r.decode_and_prefill(rows, {}, [PrefillRow(1 if n > 1 else 0, [start] * chunk, 0)], True)
        _check_logits(dec, len(rows), "mixed step", spec)
        _check_logits(pre[:, -1], 1, "mixed chunk", spec)
    # The edges requests may reach: the vocabulary's last id (the embedding's last row) and the context's last
    # position (the position table's last row, attention over the whole slot). A model.json claiming more than
    # the graph holds fails here, at load, instead of inside every request that gets there.
    top, last = spec.vocab_size - 1, spec.max_length - 1
    vocab, length = (("vocab_size", "max_length") if source is None
                     else ("encoder_decoder.target_vocab_size", "encoder_decoder.max_target_length"))
    _edge(lambda: r.decode([DecodeRow(0, top, 1)], {}), f"model.json {vocab} {top + 1}: token id {top}", spec)
    _edge(lambda: r.decode([DecodeRow(0, start, last)], {}), f"model.json {length} {last + 1}: position {last}",
          spec)
    runner.warm(label)    # the runner's own parts (an encoder-decoder's cross buffers back to size, its encoder timed)


def _warm_source(r: Runner, spec: DecoderSpec, source: SourceSpec) -> None:
    """An encoder-decoder's source side: the encoder at the source vocabulary's last id and at
    max_source_length (two rows of one call, one padded), each written into a slot and read by a decode step."""
    top, longest = source.vocab_size - 1, source.max_length
    pair = min(2, r.num_slots)

    def run() -> np.ndarray:
        r.encode([EncodeRow([source.pad_id] * longest, (0,)), EncodeRow([top], (pair - 1,))])
        return r.decode([DecodeRow(slot, source.start_id, 0) for slot in range(pair)], {})

    _edge(run, f"model.json encoder_decoder.source_vocab_size {top + 1} / max_source_length {longest}: "
               f"source token id {top} and a source of {longest} tokens", spec, pair)


def _edge(call: Callable[[], np.ndarray], what: str, spec: DecoderSpec, rows: int = 1) -> None:
    try:
        logits = call()
    except Exception as exc:  # onnxruntime's own exception types
        raise ValueError(f"{what} fails in the graph: {' '.join(str(exc).split())}") from None
    _check_logits(logits, rows, what, spec)


def _check_logits(logits: np.ndarray, batch: int, what: str, spec: DecoderSpec) -> None:
    if logits.ndim != 2 or logits.shape[0] != batch or logits.shape[1] < spec.vocab_size:
        raise RuntimeError(f"warmup {what}: logits have shape {logits.shape}, expected "
                           f"[{batch}, >= vocab_size {spec.vocab_size}]")
    if not np.isfinite(logits).all():
        raise RuntimeError(f"warmup {what}: logits are not finite")
