"""The slot runner of an encoder-decoder's decoder graph: slot_runner.SlotRunner's calls over the self cache, with
the per-slot cross-attention buffers bound beside it by the same slot range.

Cross buffers: one per decoder layer and kind, `[slots, heads, max_source_length, head_dim]` on the session's
device (device_cache.CacheBuffers; its cross-attention op runs there in every precision, while an fp32 self cache
stays on the host beside a CUDA session: Device.for_cache), written once per request by the encoder step (encoder_step.py) and bound
by address as the decoder's `cross.{i}.key|value` inputs for slots [lo, hi) of each call — read only, never
copied per step. `encoder_attention_mask` [hi - lo, max_source_length] marks each slot's source positions; the
runner keeps every slot's source length (written in the worker thread by `encode`, read by the calls after it).
A slot that holds no source yet (idle in a decode call's range) attends to one zero key: finite throw-away
outputs, never NaN.

The cross buffers' source axis is not max_source_length but the longest source admitted so far, rounded up to a
power of two (from 16): the cross-attention op reads every position it is given, masked or not, so on a package
exported with OPUS-MT's 512 positions it would read 512 per row and step however short the sources (more than
the rest of the step; docs/BENCHMARKS.md). A longer source grows them
(a copy of what the slots hold, once per doubling); the engine shrinks them back after its warm-up, and when
it goes idle with them past SHRINK_CROSS times their first length.
"""
from __future__ import annotations

import logging

import numpy as np
import onnxruntime as ort

from .device_cache import CacheBuffers, Device
from .encoder_step import EncodeRow, SourceEncoder
from .seq2seq_spec import SOURCE_MASK, SourceSpec
from .slot_runner import SlotRunner
from .spec import DecoderSpec

log = logging.getLogger(__name__)
FIRST_CROSS_LENGTH = 16
SHRINK_CROSS = 4     # idle, cross buffers longer than this many times their first length shrink back


class CrossSlotRunner(SlotRunner):
    def __init__(self, session: ort.InferenceSession, spec: DecoderSpec, source: SourceSpec, num_slots: int,
                 encoder: ort.InferenceSession, device: Device | None = None,
                 cross_length: int = FIRST_CROSS_LENGTH) -> None:
        super().__init__(session, spec, num_slots, None, device)
        self.source = source
        self.first_cross_length = min(cross_length, source.max_length)
        self.cross = CacheBuffers(source.cross_names, num_slots, source.num_heads, self.first_cross_length,
                                  source.head_dim, source.dtype, Device.of(session))
        self.encoder = SourceEncoder(encoder, source, self.cross)
        self.source_lengths = np.ones(num_slots, dtype=np.int64)
        self._positions = np.arange(self.first_cross_length)[None, :]

    @property
    def cross_length(self) -> int:
        """Source positions the cross buffers hold now (what every decode call's cross attention reads)."""
        return self.cross.shape[2]

    def reset_cross(self) -> None:
        """Back to the first length (the engine after its warm-up, which encoded a max_source_length source):
        only while no slot holds a source that is still decoded."""
        if self.cross_length != self.first_cross_length:
            self._resize_cross(self.first_cross_length)

    def idle(self) -> None:
        """Cross buffers grown past SHRINK_CROSS x their first length by a long source go back to it, so a burst of
        long sources does not make every later step read as many positions. Smaller growth stays: growing again
        costs an allocation and a copy."""
        if self.cross_length > SHRINK_CROSS * self.first_cross_length:
            self.reset_cross()

    def warm(self, label: str) -> None:
        """After the warm-up (which grew the cross buffers to max_source_length): back to the first length, and
        the encoder's cost per call and per padded token measured (it splits sources by length where that costs
        less)."""
        self.reset_cross()
        cost = self.encoder.calibrate()
        if cost is not None:
            log.info("%s encoder: a call costs %.2f ms and a padded source token %.1f us (sources split by "
                     "length where that costs less)", label, cost.call * 1e3, cost.token * 1e6)

    def _resize_cross(self, length: int) -> None:
        log.debug("cross buffers: %d -> %d source positions", self.cross_length, length)
        self.cross = self.encoder.cross = self.cross.resized(length)
        self._positions = np.arange(length)[None, :]
        self._bindings.clear()       # they bound the old buffers by address

    @property
    def cache_bytes(self) -> int:
        return self.cache.nbytes + self.cross.nbytes

    def encode(self, rows: list[EncodeRow]) -> None:
        """Sources into their slots' cross buffers (the encoder step); later calls see their lengths."""
        longest = max(len(r.source) for r in rows)
        if longest > self.cross_length:
            self._resize_cross(min(1 << (longest - 1).bit_length(), self.source.max_length))
        self.encoder.run(rows)
        for r in rows:
            for slot in r.slots:
                self.source_lengths[slot] = len(r.source)

    def _bind_slots(self, io: ort.IOBinding, prefix: str, lo: int, hi: int) -> None:
        for name in self.source.cross_names:
            self.cross.bind_input(io, name, prefix + name, lo, hi)

    def _feed_slots(self, io: ort.IOBinding, prefix: str, lo: int, hi: int) -> None:
        mask = (self._positions < self.source_lengths[lo:hi, None]).astype(np.int64)
        io.bind_cpu_input(prefix + SOURCE_MASK, mask)
