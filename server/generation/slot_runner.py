"""onnxruntime calls of an in-place-cache decoder: the slot buffers and the two kinds of call.

The cache is one buffer per layer and kind, `[slots, kv_heads, max_length, head_dim]`, allocated (and
touched, so no page faults land in a step) once when the model loads. A call binds a contiguous slice of
slots as both `past_key_values.*` and `present.*`; the graph writes the new keys/values in place.
Nothing of the cache is copied, and a sequence leaving costs nothing but its slot number.

Rows of a call are told where to write through the attention mask: row b holds `lens[b]` ones, and its
new tokens land at [lens[b] - sequence, lens[b]). A decode call covers slots [0, hi): slots in that range
that are not decoding get a throw-away token written where their owner will write next anyway (position
0 of a free slot, the next prompt position of a prefilling one), so the call never disturbs them.

Synchronous on purpose: the engine runs these in its own thread (onnxruntime releases the GIL).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from .spec import DecoderSpec


@dataclass(frozen=True)
class DecodeRow:
    slot: int
    token: int
    position: int        # where the token goes = tokens already in the slot


@dataclass(frozen=True)
class PrefillRow:
    slot: int
    tokens: list[int]
    start: int           # position of tokens[0]


class SlotRunner:
    def __init__(self, session: ort.InferenceSession, spec: DecoderSpec, num_slots: int) -> None:
        self.session = session
        self.spec = spec
        self.num_slots = num_slots
        shape = (num_slots, spec.num_kv_heads, spec.max_length, spec.head_dim)
        # np.ones then zero: every page is touched now, not during the first steps that reach it.
        self.buffers: dict[str, np.ndarray] = {}
        for name in spec.past_names:
            buf = np.ones(shape, dtype=spec.past_dtype)
            buf.fill(0)
            self.buffers[name] = buf
        self._bindings: dict[tuple[int, int], ort.IOBinding] = {}
        self._has_positions = spec.has_position_ids

    @property
    def cache_bytes(self) -> int:
        return sum(b.nbytes for b in self.buffers.values())

    # ------------------------------------------------------------------ calls

    def decode(self, rows: list[DecodeRow], idle_positions: dict[int, int]) -> np.ndarray:
        """One token for each row → logits [len(rows), vocab] in row order.

        idle_positions: for slots below the highest decoding slot that are not decoding, where a
        throw-away write is harmless (missing = 0, a free slot)."""
        hi = max(r.slot for r in rows) + 1
        tokens = np.full((hi, 1), self.spec.pad_id, dtype=np.int64)
        positions = np.zeros((hi, 1), dtype=np.int64)
        for slot, pos in idle_positions.items():
            if slot < hi:
                positions[slot, 0] = pos
        for r in rows:
            tokens[r.slot, 0] = r.token
            positions[r.slot, 0] = r.position
        logits = self._run(0, hi, tokens, positions[:, 0] + 1, positions)
        return logits[[r.slot for r in rows], 0, :]

    def prefill(self, rows: list[PrefillRow], first_prompt: bool) -> np.ndarray:
        """Prompt chunks of consecutive slots → logits at each row's last real token [len(rows), vocab].

        first_prompt: every row starts at 0 (rows may differ in length: right padding). Otherwise exactly
        one row, which continues its own prompt at `start`."""
        if not first_prompt and len(rows) != 1:
            raise ValueError("a continuation chunk runs alone (batch 1)")
        rows = sorted(rows, key=lambda r: r.slot)
        lo = rows[0].slot
        if [r.slot for r in rows] != list(range(lo, lo + len(rows))):
            raise ValueError(f"prefill rows must be consecutive slots, got {[r.slot for r in rows]}")
        width = max(len(r.tokens) for r in rows)
        ids = np.full((len(rows), width), self.spec.pad_id, dtype=np.int64)
        positions = np.zeros((len(rows), width), dtype=np.int64)
        lens = np.zeros(len(rows), dtype=np.int64)
        for i, r in enumerate(rows):
            ids[i, :len(r.tokens)] = r.tokens
            # Padding positions continue the count (clipped to the table): their outputs are thrown away.
            positions[i] = np.minimum(np.arange(r.start, r.start + width), self.spec.max_length - 1)
            lens[i] = len(r.tokens) if first_prompt else r.start + width
        logits = self._run(lo, lo + len(rows), ids, lens, positions)
        last = np.array([len(r.tokens) - 1 for r in rows])
        return logits[np.arange(len(rows)), last, :]

    # ------------------------------------------------------------------ binding

    def _binding(self, lo: int, hi: int) -> ort.IOBinding:
        io = self._bindings.get((lo, hi))
        if io is None:
            io = self.session.io_binding()
            for past, present in zip(self.spec.past_names, self.spec.present_names):
                view = ort.OrtValue.ortvalue_from_numpy(self.buffers[past][lo:hi])   # shares the memory
                io.bind_ortvalue_input(past, view)
                io.bind_ortvalue_output(present, view)
            self._bindings[(lo, hi)] = io
        return io

    def _run(self, lo: int, hi: int, ids: np.ndarray, lens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        if int(lens.max()) > self.spec.max_length:
            raise ValueError(f"a row would write past the context of {self.spec.max_length} tokens")
        width = int(lens.max())
        mask = (np.arange(width)[None, :] < lens[:, None]).astype(np.int64)
        io = self._binding(lo, hi)
        io.bind_cpu_input("input_ids", ids)
        io.bind_cpu_input("attention_mask", mask)
        if self._has_positions:
            io.bind_cpu_input("position_ids", positions)
        io.bind_output("logits")
        self.session.run_with_iobinding(io)
        return io.get_outputs()[-1].numpy()
