"""The encoder step of an encoder-decoder package: sources admitted in one iteration are encoded in ONE call, and
each row's cross-attention keys/values are copied once into its slots' cross buffers (device_cache.py: on the
session's device, one strided copy per row, slot and buffer). Decoding then reads them in place every step.

Runs in the engine's worker thread, before the iteration's decoder calls (the executor's order), so a sequence
admitted this iteration takes its first decoder step in the same iteration.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from .device_cache import CacheBuffers
from .seq2seq_spec import SourceSpec


@dataclass(frozen=True)
class EncodeRow:
    source: list[int]          # source ids (checked: within the vocabulary, at most max_source_length)
    slots: tuple[int, ...]     # every slot that decodes from it (one; a beam search's k)


class SourceEncoder:
    def __init__(self, session: ort.InferenceSession, spec: SourceSpec, cross: CacheBuffers) -> None:
        self.session = session
        self.spec = spec
        self.cross = cross

    def run(self, rows: list[EncodeRow]) -> None:
        """Encode the sources (right-padded to the longest) and write each into its slots at positions
        [0, its padded width): the positions past a row's own length are masked by its encoder_attention_mask."""
        width = max(len(r.source) for r in rows)
        if width > self.spec.max_length:
            raise ValueError(f"a source of {width} tokens exceeds max_source_length {self.spec.max_length}")
        ids = np.full((len(rows), width), self.spec.pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, r in enumerate(rows):
            ids[i, :len(r.source)] = r.source
            mask[i, :len(r.source)] = 1
        device = self.cross.device
        io = self.session.io_binding()
        io.bind_cpu_input("input_ids", ids)
        io.bind_cpu_input("attention_mask", mask)
        names = self.spec.cross_names
        for name in names:     # left on the device: copied from there into the slots
            io.bind_output(name, device.kind, device.index)
        self.session.run_with_iobinding(io)
        targets = [(i, slot) for i, r in enumerate(rows) for slot in r.slots]
        for name, value in zip(names, io.get_outputs()):
            self.cross.write_rows(name, value, targets)
        self.cross.synchronize()

    def warmup_rows(self, slot: int) -> list[EncodeRow]:
        """What serving reaches: the source vocabulary's last id, and a source of max_source_length tokens."""
        top, longest = self.spec.vocab_size - 1, self.spec.max_length
        return [EncodeRow([top], (slot,)), EncodeRow([self.spec.pad_id] * longest, (slot,))]
