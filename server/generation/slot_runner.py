"""onnxruntime calls of an in-place-cache decoder: the slot buffers and the two kinds of call.

The cache is one buffer per layer and kind, `[slots, kv_heads, max_length, head_dim]`, allocated once when
the model loads on the session's own device (device_cache.py: host memory for the CPU provider, GPU memory
for CUDA). A call binds a contiguous slice of slots, by address, as both `past_key_values.*` and `present.*`;
the graph writes the new keys/values in place. Nothing of the cache is copied, not even between host and
device, and a sequence leaving costs nothing but its slot number.

Rows of a call are told where to write through the attention mask: row b holds `lens[b]` ones, and its
new tokens land at [lens[b] - sequence, lens[b]). A decode call covers slots [0, hi): slots in that range
that are not decoding get a throw-away token written where their owner will write next anyway (position
0 of a free slot, the next prompt position of a prefilling one), so the call never disturbs them.

With the package's mixed graph (two groups of rows sharing every weight multiplication), a decode step and a
prompt chunk of the same iteration are one run. Alone, each runs on the plain graph — it has fewer nodes, and
with threads that sleep between ops every node costs a wake-up (bench/FINDINGS.md). The same holds
when the sessions spin on the process's one shared pool (spinning "on", server/sessions.py). Only when two
spinning sessions have a pool each (spinning "auto") does every call go through the mixed session: right after
a run of one, its threads still spin while the other's first runs are slower. The idle group
is then filled by a one-token throw-away row in a scratch slot (one slot past the last real one).

Synchronous on purpose: the engine runs these in its own thread (onnxruntime releases the GIL).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from modelpkg import MIXED_PREFIX

from .device_cache import CacheBuffers, Device
from .encoder_step import EncodeRow
from .scheduler import Copy
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
    def __init__(self, session: ort.InferenceSession, spec: DecoderSpec, num_slots: int,
                 mixed: ort.InferenceSession | None = None, device: Device | None = None) -> None:
        """device: where the cache lives; where the session's attention op runs unless told (Device.for_cache).
        Another device is for bench/gpu_slots.py's A/B only: onnxruntime then copies every bound slice there and
        back around the op each call, and its answers are not the same (docs/GPU.md)."""
        self.session = session
        self.mixed_session = mixed   # the package's two-group graph (decode rows + one prompt chunk), if any
        self.spec = spec
        self.num_slots = num_slots
        self.scratch = num_slots          # the throw-away slot of the mixed graph's filler rows
        self.mixed_only = mixed is not None and _spins(mixed) and _own_pool(mixed)
        self.cache = CacheBuffers(spec.past_names, num_slots + (1 if mixed is not None else 0), spec.num_kv_heads,
                                  spec.max_length, spec.head_dim, spec.past_dtype,
                                  device or Device.for_cache(session, spec.past_dtype))
        self._bindings: dict[tuple, ort.IOBinding] = {}
        # Logits buffers of one-token calls (decode), bound as the graph's output: no allocation, no copy out.
        self._logits: dict[tuple, tuple[np.ndarray, ort.OrtValue]] = {}
        self._has_positions = spec.has_position_ids

    @property
    def cache_bytes(self) -> int:
        return self.cache.nbytes

    @property
    def device(self) -> Device:
        return self.cache.device

    # ------------------------------------------------------------------ calls

    def decode(self, rows: list[DecodeRow], idle_positions: dict[int, int]) -> np.ndarray:
        """One token for each row → logits [len(rows), vocab] in row order, valid until this runner's next
        decode: when the rows are slots 0..n-1 in order they are the runner's own buffer, not a copy (a copy of
        every row's logits each step: bench/FINDINGS.md). A caller copies what it keeps longer.

        idle_positions: for slots below the highest decoding slot that are not decoding, where a
        throw-away write is harmless (missing = 0, a free slot)."""
        hi, feeds = self._decode_feeds(rows, idle_positions)
        if self.mixed_only:
            logits = self._run([(self.mixed_session, "", 0, hi, *feeds), self._filler(MIXED_PREFIX)], reuse=True)[0]
        else:
            logits = self._run([(self.session, "", 0, hi, *feeds)], reuse=True)[0]
        slots = [r.slot for r in rows]
        if len(slots) == logits.shape[0] and slots == list(range(len(slots))):
            return logits[:, 0, :]
        return logits[slots, 0, :]

    def decode_and_prefill(self, rows: list[DecodeRow], idle_positions: dict[int, int], chunk: list[PrefillRow],
                           first_prompt: bool) -> tuple[np.ndarray, np.ndarray]:
        """decode() and prefill() in ONE run of the mixed graph: the weights are read once for both."""
        if self.mixed_session is None:
            raise RuntimeError("this package has no mixed graph")
        hi, dfeeds = self._decode_feeds(rows, idle_positions)
        lo, n, pfeeds = self._prefill_feeds(chunk, first_prompt)
        dl, pl = self._run([(self.mixed_session, "", 0, hi, *dfeeds), (self.mixed_session, MIXED_PREFIX, lo, lo + n, *pfeeds)])
        return dl[[r.slot for r in rows], 0, :], pl

    def prefill(self, rows: list[PrefillRow], first_prompt: bool) -> np.ndarray:
        """Prompt chunks of consecutive slots → logits at every position of each row [len(rows), width, vocab]
        in slot order (row i's own tokens are positions [0, len(tokens)); the rest is padding).

        first_prompt: every row starts at 0 (rows may differ in length: right padding). Otherwise exactly
        one row, which continues its own prompt at `start`."""
        lo, n, feeds = self._prefill_feeds(rows, first_prompt)
        if self.mixed_only:
            return self._run([self._filler(""), (self.mixed_session, MIXED_PREFIX, lo, lo + n, *feeds)])[1]
        return self._run([(self.session, "", lo, lo + n, *feeds)])[0]

    def _filler(self, prefix: str) -> tuple:
        """One throw-away token at position 0 of the scratch slot, for the mixed graph's idle group."""
        one = np.full((1, 1), self.spec.pad_id, dtype=np.int64)
        return (self.mixed_session, prefix, self.scratch, self.scratch + 1, one, np.ones(1, np.int64),
                np.zeros((1, 1), np.int64))

    def copy_prefix(self, source: int, target: int, length: int) -> None:
        """Positions [0, length) of one slot into another, every layer and kind (a reused prompt prefix)."""
        self.copy_prefixes([Copy(source, target, length)])

    def copy_prefixes(self, copies: list[Copy]) -> None:
        """Positions [0, copy.length) of slot copy.source into copy.target, every layer and kind, for several slots
        (none both a source and a target: a beam step's copies), those of one length together."""
        by_length: dict[int, list[Copy]] = {}
        for copy in copies:
            if not (0 <= copy.source < self.num_slots and 0 <= copy.target < self.num_slots
                    and 0 < copy.length < self.spec.max_length):
                raise ValueError(f"copy_prefix: slots {copy.source} -> {copy.target}, {copy.length} tokens out of "
                                 "range")
            by_length.setdefault(copy.length, []).append(copy)
        for length, group in by_length.items():
            self.cache.copy_prefixes([c.source for c in group], [c.target for c in group], length)

    # ------------------------------------------------------------------ inputs

    def _decode_feeds(self, rows: list[DecodeRow], idle_positions: dict[int, int]
                      ) -> tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        hi = max(r.slot for r in rows) + 1
        tokens = np.full((hi, 1), self.spec.pad_id, dtype=np.int64)
        positions = np.zeros((hi, 1), dtype=np.int64)
        for slot, pos in idle_positions.items():
            if slot < hi:
                positions[slot, 0] = pos
        for r in rows:
            tokens[r.slot, 0] = r.token
            positions[r.slot, 0] = r.position
        return hi, (tokens, positions[:, 0] + 1, positions)

    def _prefill_feeds(self, rows: list[PrefillRow], first_prompt: bool
                       ) -> tuple[int, int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
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
        return lo, len(rows), (ids, lens, positions)

    # ------------------------------------------------------------------ binding

    def _binding(self, session: ort.InferenceSession, slices: tuple[tuple[str, int, int], ...]) -> ort.IOBinding:
        """Cache buffers bound once per (session, slot ranges), by address: the graph reads and writes them."""
        key = (id(session), slices)
        io = self._bindings.get(key)
        if io is None:
            io = session.io_binding()
            for prefix, lo, hi in slices:
                for past, present in zip(self.spec.past_names, self.spec.present_names):
                    self.cache.bind(io, past, prefix + past, prefix + present, lo, hi)
                self._bind_slots(io, prefix, lo, hi)
            self._bindings[key] = io
        return io

    def _run(self, groups: list[tuple], reuse: bool = False) -> list[np.ndarray]:
        """groups: (session, prefix, lo, hi, ids, lens, positions) — all of one session. Logits per group.

        reuse (one-token groups only): the logits land in a buffer of the runner's, returned as it is and written
        again by the next such call, so the caller copies what it keeps (decode() does). It saves allocating the
        output and onnxruntime's get_outputs, which wraps every bound cache buffer (bench/FINDINGS.md)."""
        session = groups[0][0]
        io = self._binding(session, tuple((g[1], g[2], g[3]) for g in groups))
        buffers = [self._logits_buffer(session, g[1], g[4].shape[0]) for g in groups] if reuse else []
        if any(b is None for b in buffers):
            buffers = []
        for i, (_, prefix, lo, hi, ids, lens, positions) in enumerate(groups):
            if int(lens.max()) > self.spec.max_length:
                raise ValueError(f"a row would write past the context of {self.spec.max_length} tokens")
            width = int(lens.max())
            io.bind_cpu_input(prefix + "input_ids", ids)
            io.bind_cpu_input(prefix + "attention_mask", (np.arange(width)[None, :] < lens[:, None]).astype(np.int64))
            if self._has_positions:
                io.bind_cpu_input(prefix + "position_ids", positions)
            self._feed_slots(io, prefix, lo, hi)
            if buffers:
                io.bind_ortvalue_output(prefix + "logits", buffers[i][1])
            else:
                io.bind_output(prefix + "logits")
        session.run_with_iobinding(io)
        if buffers:
            return [array for array, _ in buffers]
        outputs = io.get_outputs()
        return [o.numpy() for o in outputs[-len(groups):]]

    def _logits_buffer(self, session: ort.InferenceSession, prefix: str, rows: int
                       ) -> tuple[np.ndarray, ort.OrtValue] | None:
        """The [rows, 1, vocab] logits buffer of one-token calls; None when the graph's vocabulary axis is not fixed,
        its logits are not float32, or the cache lives on a GPU (logits then come back through onnxruntime's copy)."""
        key = (id(session), prefix, rows)
        found = self._logits.get(key)
        if found is None:
            if self.cache.device.kind != "cpu":
                return None
            [out] = [o for o in session.get_outputs() if o.name == prefix + "logits"]
            width = out.shape[-1]
            if not isinstance(width, int) or out.type != "tensor(float)":
                return None
            array = np.empty((rows, 1, width), np.float32)
            found = self._logits[key] = (array, ort.OrtValue.ortvalue_from_numpy(array))
        return found


    def idle(self) -> None:
        """The engine has nothing in flight and no slot in use (called from its loop between runs)."""

    def encode(self, rows: list[EncodeRow]) -> None:
        """A decoder has no encoder: the scheduler plans no encoder step for it."""
        raise RuntimeError("a decoder-only package has no encoder step")

    def warm(self, label: str) -> None:
        """After the warm-up's calls (warmup.py): nothing of a decoder's own to settle."""

    # ------------------------------------------------------------------ what a subclass adds per slot range

    def _bind_slots(self, io: ort.IOBinding, prefix: str, lo: int, hi: int) -> None:
        """More device buffers of slots [lo, hi) to bind once per binding (an encoder-decoder's cross buffers)."""

    def _feed_slots(self, io: ort.IOBinding, prefix: str, lo: int, hi: int) -> None:
        """More host inputs of slots [lo, hi) to bind before each run (an encoder-decoder's source mask)."""


def _spins(session: ort.InferenceSession) -> bool:
    """Whether the session's intra-op threads spin (onnxruntime's default when the entry is unset)."""
    try:
        value = session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")
    except RuntimeError:    # unset
        return True
    return value != "0"


def _own_pool(session: ort.InferenceSession) -> bool:
    """Whether the session has threads of its own (False: it shares the process's pool with the plain graph)."""
    return session.get_session_options().use_per_session_threads
