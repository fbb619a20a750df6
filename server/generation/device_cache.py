"""The in-place decoder's cache buffers, allocated once on the device of the session's attention op and bound by
pointer.

One buffer per layer and kind, `[slots, kv_heads, max_length, head_dim]`, each an onnxruntime OrtValue on
the device the attention op computes on ("cpu" or "cuda": `Device.for_cache`). A call binds a contiguous slice of slots as both the
graph's `past_key_values.*` input and its `present.*` output: the slice is the buffer's base address plus
`lo` slot strides, so nothing of the cache crosses between host and device, whatever the provider.

An encoder-decoder (seq2seq) package has a second set of the same kind: the per-slot cross-attention buffers
`[slots, heads, max_source_length, head_dim]`, written once per request from the encoder's output (`write_rows`)
and bound by slot range as the decoder's read-only `cross.*` inputs.

The few operations on the memory itself — zeroing at allocation, copying a prompt prefix from one slot to
another (a reused prefix; a beam's parent's rows), copying an encoder output's row into a slot — go through
`Device`, which does them with the C library on the host and with the CUDA runtime
on a GPU (ctypes calls into libraries onnxruntime already loaded; no compiled code of ours). Everything
else — shapes, offsets, bindings — is the same code for every device, so the CPU tests exercise it.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import onnxruntime as ort

CUDA_PROVIDER = "CUDAExecutionProvider"
_CUDA_MEMCPY_DEVICE_TO_DEVICE = 3
_CUDART_NAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")


@dataclass(frozen=True)
class Device:
    """Where a session computes: onnxruntime's device name ("cpu", "cuda") and index."""

    kind: str = "cpu"
    index: int = 0

    @classmethod
    def of(cls, session: ort.InferenceSession) -> "Device":
        """The device of the session's first provider."""
        provider = session.get_providers()[0]
        if provider == CUDA_PROVIDER:
            options = session.get_provider_options().get(CUDA_PROVIDER, {})
            return cls("cuda", int(options.get("device_id", 0)))
        return cls("cpu", 0)

    @classmethod
    def for_cache(cls, session: ort.InferenceSession, dtype: type) -> "Device":
        """Where an in-place cache of `dtype` must live: where the session's attention op reads and writes it.
        onnxruntime's CUDA GroupQueryAttention takes fp16 caches only; with any other the op runs on the CPU
        provider, and a cache bound in GPU memory then crosses to the host and back around it every call —
        which on an H100 (onnxruntime-gpu 1.31) also gave wrong answers from the second token on (docs/GPU.md).
        So such a cache stays in host memory, shared in place by the op; the session's other ops keep the GPU."""
        device = cls.of(session)
        if device.kind == "cuda" and np.dtype(dtype) != np.float16:
            return cls("cpu", 0)
        return device

    # -------------------------------------------------------------- memory

    def zeros(self, shape: tuple[int, ...], dtype: type) -> ort.OrtValue:
        """A zero-filled tensor on this device. Zero matters: attention weighs masked positions by 0, and
        0 x NaN of uninitialised memory would still be NaN. On the host the fill also touches every page
        now rather than in the first steps that reach it."""
        value = ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, self.kind, self.index)
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if self.kind == "cuda":
            _check(self._cudart.cudaMemset(ctypes.c_void_p(value.data_ptr()), 0, ctypes.c_size_t(nbytes)),
                   "cudaMemset")
        else:
            _advise_huge_pages(value.data_ptr(), nbytes)
            ctypes.memset(value.data_ptr(), 0, nbytes)
        return value

    def copy_rows(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, rows: int) -> None:
        """`rows` blocks of `width` bytes, block r from src + r*src_pitch to dst + r*dst_pitch (a strided copy:
        the first positions of every head of one slot). Returns when the copy is done."""
        if self.kind == "cuda":
            rt = self._cudart
            _check(rt.cudaMemcpy2DAsync(ctypes.c_void_p(dst), ctypes.c_size_t(dst_pitch), ctypes.c_void_p(src),
                                        ctypes.c_size_t(src_pitch), ctypes.c_size_t(width), ctypes.c_size_t(rows),
                                        _CUDA_MEMCPY_DEVICE_TO_DEVICE, ctypes.c_void_p(0)), "cudaMemcpy2DAsync")
            return
        for r in range(rows):
            ctypes.memmove(dst + r * dst_pitch, src + r * src_pitch, width)

    def synchronize(self) -> None:
        """Wait for copies queued on the device (onnxruntime's own runs already wait at their end)."""
        if self.kind == "cuda":
            _check(self._cudart.cudaStreamSynchronize(ctypes.c_void_p(0)), "cudaStreamSynchronize")

    @cached_property
    def _cudart(self) -> ctypes.CDLL:
        """The CUDA runtime onnxruntime's CUDA provider loaded (same library, same context)."""
        for name in _CUDART_NAMES:
            try:
                rt = ctypes.CDLL(name)
                break
            except OSError:
                continue
        else:
            raise RuntimeError(f"cache on cuda: none of {', '.join(_CUDART_NAMES)} can be loaded")
        _check(rt.cudaSetDevice(self.index), "cudaSetDevice")
        return rt


_MADV_HUGEPAGE = 14
_PAGE = 4096


def _advise_huge_pages(address: int, nbytes: int) -> None:
    """Ask Linux for transparent huge pages over a host buffer, as numpy does for its large arrays. Where THP is
    "madvise" (the common default, and this machine's), memory onnxruntime allocates gets 4 KiB pages: a
    prefill into a large cache then ran slower than over numpy-allocated buffers (TLB misses;
    docs/BENCHMARKS.md). Best effort: elsewhere the call fails and changes nothing."""
    libc = _libc()
    if libc is None:
        return
    start = (address + _PAGE - 1) // _PAGE * _PAGE       # madvise wants a page-aligned start
    length = address + nbytes - start
    if length > 0:
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), _MADV_HUGEPAGE)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed with CUDA error {status}")


class CacheBuffers:
    """Every layer's key and value buffer of one decoder, on one device."""

    def __init__(self, names: list[str], slots: int, kv_heads: int, max_length: int, head_dim: int,
                 dtype: type, device: Device) -> None:
        self.device = device
        self.dtype = np.dtype(dtype).type
        self.shape = (slots, kv_heads, max_length, head_dim)
        self._item = np.dtype(dtype).itemsize
        self.slot_bytes = kv_heads * max_length * head_dim * self._item
        self.values = {name: device.zeros(self.shape, self.dtype) for name in names}
        # On the host, numpy views of the same memory: many slots' copies as one gather and scatter per buffer.
        self._views = {} if device.kind == "cuda" else {name: _host_view(v, self.shape, self.dtype)
                                                         for name, v in self.values.items()}

    @property
    def nbytes(self) -> int:
        return self.slot_bytes * self.shape[0] * len(self.values)

    def bind(self, io: ort.IOBinding, name: str, input_name: str, output_name: str, lo: int, hi: int) -> None:
        """Slots [lo, hi) of buffer `name` as the graph's input and output of the same memory."""
        if not 0 <= lo < hi <= self.shape[0]:
            raise ValueError(f"cache slots [{lo}, {hi}) outside [0, {self.shape[0]})")
        ptr = self.values[name].data_ptr() + lo * self.slot_bytes
        shape = [hi - lo, *self.shape[1:]]
        io.bind_input(input_name, self.device.kind, self.device.index, self.dtype, shape, ptr)
        io.bind_output(output_name, self.device.kind, self.device.index, self.dtype, shape, ptr)

    def bind_input(self, io: ort.IOBinding, name: str, input_name: str, lo: int, hi: int) -> None:
        """Slots [lo, hi) of buffer `name` as a read-only graph input (an encoder-decoder's cross keys/values)."""
        if not 0 <= lo < hi <= self.shape[0]:
            raise ValueError(f"cache slots [{lo}, {hi}) outside [0, {self.shape[0]})")
        ptr = self.values[name].data_ptr() + lo * self.slot_bytes
        io.bind_input(input_name, self.device.kind, self.device.index, self.dtype, [hi - lo, *self.shape[1:]], ptr)

    def copy_prefix(self, source: int, target: int, length: int) -> None:
        """Positions [0, length) of slot `source` into slot `target`, every buffer, on the device."""
        self.copy_prefixes([source], [target], length)

    def copy_prefixes(self, sources: list[int], targets: list[int], length: int) -> None:
        """Positions [0, length) of each slot in `sources` into the slot at the same index of `targets`, every
        buffer, on the device: as if one after the other, with no target also a source (a beam step's copies:
        a kept hypothesis's slot into a dropped one's). On the host one gather and scatter per buffer (instead of
        a memmove per slot, buffer and head; bench/FINDINGS.md), on a GPU one 2-D copy per slot and buffer."""
        slots, heads, max_length, head_dim = self.shape
        if len(sources) != len(targets):
            raise ValueError(f"copy_prefixes: {len(sources)} sources for {len(targets)} targets")
        pairs = [(s, t) for s, t in zip(sources, targets) if s != t]     # a slot into itself: nothing to do
        sources, targets = [s for s, _ in pairs], [t for _, t in pairs]
        for source, target in zip(sources, targets):
            if not (0 <= source < slots and 0 <= target < slots and 0 < length <= max_length):
                raise ValueError(f"copy_prefix: slots {source} -> {target}, {length} tokens out of range")
        if set(sources) & set(targets):
            raise ValueError(f"copy_prefixes: slots {sorted(set(sources) & set(targets))} are sources and targets")
        if not sources:
            return
        if self._views:
            for view in self._views.values():
                view[targets, :, :length] = view[sources, :, :length]
            return
        pitch = max_length * head_dim * self._item          # one head's positions
        for value in self.values.values():
            base = value.data_ptr()
            for source, target in zip(sources, targets):
                self.device.copy_rows(base + target * self.slot_bytes, pitch, base + source * self.slot_bytes,
                                      pitch, length * head_dim * self._item, heads)
        self.device.synchronize()

    @property
    def on_host(self) -> bool:
        """The buffers are host memory (numpy views of them: copies as gathers and scatters)."""
        return bool(self._views)

    def write_rows(self, name: str, value: ort.OrtValue, rows: list[tuple[int, int]]) -> None:
        """Copy rows of `value` ([batch, heads, length, head_dim], on this device, C-contiguous: an encoder's
        output) into slots of buffer `name` at positions [0, length): (row, slot) pairs, one strided copy each
        on the device. Call `synchronize` after the last one. Positions past `length` keep what they held."""
        if self._views:
            # On the host one gather and scatter per buffer, not a memmove per row and head (bench/FINDINGS.md);
            # the encoder's output read as an array (a copy of it) costs less than a view made over its address.
            self.write_host_rows(name, value.numpy(), rows)
            return
        _, heads, length, head_dim = self._check_rows(name, value.shape(), rows)
        src_pitch, dst_pitch = length * head_dim * self._item, self.shape[2] * head_dim * self._item
        base, src = self.values[name].data_ptr(), value.data_ptr()
        for row, slot in rows:
            self.device.copy_rows(base + slot * self.slot_bytes, dst_pitch, src + row * heads * src_pitch,
                                  src_pitch, src_pitch, heads)

    def write_host_rows(self, name: str, array: np.ndarray, rows: list[tuple[int, int]]) -> None:
        """write_rows from a host array into host buffers: one gather and scatter per buffer (the encoder's outputs
        bound into its own buffers are read in place: encoder_step.py)."""
        if not self._views:
            raise ValueError("write_host_rows: these buffers are not on the host")
        length = self._check_rows(name, array.shape, rows)[2]
        self._views[name][[s for _, s in rows], :, :length] = array[[r for r, _ in rows]]

    def _check_rows(self, name: str, shape: Sequence[int], rows: list[tuple[int, int]]) -> tuple[int, int, int, int]:
        """A [batch, heads, length, head_dim] source for `rows` ((row, slot) pairs) of buffer `name`, or ValueError."""
        slots, heads, max_length, head_dim = self.shape
        batch, their_heads, length, their_dim = shape
        if (their_heads, their_dim) != (heads, head_dim) or length > max_length:
            raise ValueError(f"write_rows: a [{batch}, {their_heads}, {length}, {their_dim}] tensor does not fit "
                             f"buffer {name!r} of [{slots}, {heads}, {max_length}, {head_dim}]")
        for row, slot in rows:
            if not (0 <= row < batch and 0 <= slot < slots):
                raise ValueError(f"write_rows: row {row} -> slot {slot} out of range")
        return batch, heads, length, head_dim

    def synchronize(self) -> None:
        self.device.synchronize()

    def resized(self, max_length: int) -> "CacheBuffers":
        """New buffers of `max_length` positions on the same device, every slot's first positions (as many as both
        hold) copied over: one strided copy per buffer, a block per slot and head."""
        slots, heads, length, head_dim = self.shape
        names = list(self.values)
        new = CacheBuffers(names, slots, heads, max_length, head_dim, self.dtype, self.device)
        width = min(length, max_length) * head_dim * self._item
        for name in names:
            new.device.copy_rows(new.values[name].data_ptr(), max_length * head_dim * self._item,
                                 self.values[name].data_ptr(), length * head_dim * self._item, width, slots * heads)
        new.synchronize()
        return new

    def host_copy(self, name: str) -> np.ndarray:
        """The whole buffer as a host array (tests and debugging; a device-to-host copy on a GPU)."""
        return self.values[name].numpy()


def _host_view(value: ort.OrtValue, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """A numpy array over a host OrtValue's memory (no copy; valid while the OrtValue lives)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer((ctypes.c_byte * nbytes).from_address(value.data_ptr()), dtype=dtype).reshape(shape)
