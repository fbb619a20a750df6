"""The encoder step of an encoder-decoder package: sources admitted in one iteration are encoded together, and
each row's cross-attention keys/values are copied once into its slots' cross buffers (device_cache.py: on the
session's device, one strided copy per row, slot and buffer). Decoding then reads them in place every step.

A call pads its rows to the longest, and padded positions cost what real ones do. Once calibrated (the engine's
warm-up times two calls: `EncoderCost`), the rows are sorted by length and split into the calls that cost least
in all: a split where the padding it saves costs more than one more call. Where a call costs what a few dozen
padded tokens do, sources of mixed lengths go as a few calls instead of one; where a call costs more than the
padding of a batch's few short words (g2p), they mostly stay one (bench/FINDINGS.md has the measured costs).

Runs in the engine's worker thread, before the iteration's decoder calls (the executor's order), so a sequence
admitted this iteration takes its first decoder step in the same iteration.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from .device_cache import CacheBuffers
from .seq2seq_spec import SourceSpec


@dataclass(frozen=True)
class EncodeRow:
    source: list[int]          # source ids (checked: within the vocabulary, at most max_source_length)
    slots: tuple[int, ...]     # every slot that decodes from it (one; a beam search's k)


@dataclass(frozen=True)
class EncoderCost:
    """Seconds one encoder call takes: `call` whatever its size, plus `token` per padded source token."""

    call: float
    token: float

    def groups(self, lengths: list[int]) -> list[list[int]]:
        """Indices of `lengths` in the calls that cost least in all: longest first, each call a run of the sorted
        order (a split anywhere else pads more for the same calls). Dynamic programming over the split points."""
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        best = [0.0] + [float("inf")] * len(order)     # best[k]: the first k rows of `order`
        cut = [0] * (len(order) + 1)
        for k in range(1, len(order) + 1):
            for j in range(k):                          # rows j..k-1 in one call, padded to row j's length
                cost = best[j] + self.call + self.token * (k - j) * lengths[order[j]]
                if cost < best[k]:
                    best[k], cut[k] = cost, j
        calls, k = [], len(order)
        while k:
            calls.append(order[cut[k]:k])
            k = cut[k]
        return calls[::-1]


class SourceEncoder:
    def __init__(self, session: ort.InferenceSession, spec: SourceSpec, cross: CacheBuffers) -> None:
        self.session = session
        self.spec = spec
        self.cross = cross
        self.cost: EncoderCost | None = None       # None: every group of rows in one call
        self._io = session.io_binding()            # one binding, its inputs and outputs bound anew each call
        # On the host the encoder writes its outputs into these (grown to the largest call so far), read in place
        # by the copies into the slots: no output allocated and wrapped per call, no copy of it first.
        self._out: dict[str, np.ndarray] = {}

    def calibrate(self, rows: int = 8, short: int = 8, long: int = 32, repeats: int = 3) -> EncoderCost | None:
        """Time calls of `rows` sources of `short` and of `long` tokens (the fastest of `repeats` each, both within
        max_source_length): what a padded token and a call cost on this machine, for splitting rows by length
        (run's groups). None, and one call per group, when sources are too short to differ (max length 1)."""
        if self.spec.max_length < 2:
            return None
        long = min(long, self.spec.max_length)
        short = max(1, min(short, long // 2))

        def seconds(width: int) -> float:
            feeds = {"input_ids": np.full((rows, width), self.spec.pad_id, dtype=np.int64),
                     "attention_mask": np.ones((rows, width), dtype=np.int64)}
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                self.session.run(None, feeds)
                times.append(time.perf_counter() - started)
            return min(times)
        a, b = seconds(short), seconds(long)
        token = max(b - a, 0.0) / (rows * (long - short))
        self.cost = EncoderCost(call=max(a - token * rows * short, 0.0), token=token)
        return self.cost

    def run(self, rows: list[EncodeRow]) -> None:
        """Encode the sources, in the calls `cost` picks (one call until calibrated)."""
        if self.cost is None or len(rows) < 2:
            self._call(rows)
            return
        for group in self.cost.groups([len(r.source) for r in rows]):
            self._call([rows[i] for i in group])

    def _call(self, rows: list[EncodeRow]) -> None:
        """One encoder call over the sources (right-padded to the longest), each written into its slots at positions
        [0, its padded width): the positions past a row's own length are masked by its encoder_attention_mask."""
        width = max(len(r.source) for r in rows)
        if width > self.spec.max_length:
            raise ValueError(f"a source of {width} tokens exceeds max_source_length {self.spec.max_length}")
        ids = np.full((len(rows), width), self.spec.pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, r in enumerate(rows):
            ids[i, :len(r.source)] = r.source
            mask[i, :len(r.source)] = 1
        device, io = self.cross.device, self._io
        io.bind_cpu_input("input_ids", ids)
        io.bind_cpu_input("attention_mask", mask)
        names = self.spec.cross_names
        targets = [(i, slot) for i, r in enumerate(rows) for slot in r.slots]
        if self.cross.on_host:
            outputs = self._host_outputs(len(rows), width)
            for name, array in outputs.items():
                io.bind_output(name, "cpu", 0, self.cross.dtype, list(array.shape), array.ctypes.data)
            self.session.run_with_iobinding(io)
            for name, array in outputs.items():
                self.cross.write_host_rows(name, array, targets)
            return
        for name in names:     # left on the device: copied from there into the slots
            io.bind_output(name, device.kind, device.index)
        self.session.run_with_iobinding(io)
        for name, value in zip(names, io.get_outputs()):
            self.cross.write_rows(name, value, targets)
        self.cross.synchronize()

    def _host_outputs(self, rows: int, width: int) -> dict[str, np.ndarray]:
        """Each cross output of a call of `rows` sources padded to `width`, as a C-contiguous view at the start of
        its buffer (grown when a call is larger than any before)."""
        _, heads, _, head_dim = self.cross.shape
        size = rows * heads * width * head_dim
        names = self.spec.cross_names
        if not self._out or self._out[names[0]].size < size:
            self._out = {name: np.empty(size, self.cross.dtype) for name in names}
        return {name: self._out[name][:size].reshape(rows, heads, width, head_dim) for name in names}
