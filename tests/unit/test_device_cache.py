"""The in-place cache's device buffers (server/generation/device_cache.py) on the host device: the code path
the CUDA provider takes too, with only the memory calls differing (docs/GPU.md for the GPU run)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from server.generation.device_cache import CacheBuffers, Device


CUDA = "CUDAExecutionProvider"
PROVIDERS = ["CPUExecutionProvider",
             pytest.param(CUDA, marks=[pytest.mark.gpu, pytest.mark.skipif(
                 CUDA not in ort.get_available_providers(),
                 reason="this onnxruntime has no CUDAExecutionProvider (CPU build): the host device runs the same code")])]


def _add_in_place_session(provider: str = "CPUExecutionProvider") -> ort.InferenceSession:
    """present = past + delta, with past and present bound to the same memory (what the attention op does)."""
    shape = ["b", 2, 5, 3]
    graph = helper.make_graph(
        [helper.make_node("Add", ["past", "delta"], ["present"])], "add",
        [helper.make_tensor_value_info("past", TensorProto.FLOAT, shape),
         helper.make_tensor_value_info("delta", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("present", TensorProto.FLOAT, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return ort.InferenceSession(model.SerializeToString(), providers=[provider])


@pytest.mark.parametrize("provider", PROVIDERS)
def test_buffers_start_zeroed_and_a_bound_slice_is_written_in_place(provider: str) -> None:
    session = _add_in_place_session(provider)
    assert Device.of(session) == Device("cuda" if provider == CUDA else "cpu", 0)
    # An fp16 cache lives where the session computes; any other stays on the host, where onnxruntime's attention
    # op runs for it (its CUDA GroupQueryAttention takes fp16 only).
    assert Device.for_cache(session, np.float16) == Device.of(session)
    assert Device.for_cache(session, np.float32) == Device.for_cache(session, np.int8) == Device("cpu", 0)
    cache = CacheBuffers(["past"], slots=4, kv_heads=2, max_length=5, head_dim=3, dtype=np.float32,
                         device=Device.of(session))
    assert cache.nbytes == 4 * 2 * 5 * 3 * 4
    assert not cache.host_copy("past").any()
    delta = np.arange(2 * 2 * 5 * 3, dtype=np.float32).reshape(2, 2, 5, 3) + 1
    io = session.io_binding()
    cache.bind(io, "past", "past", "present", 1, 3)       # slots 1 and 2 only
    io.bind_cpu_input("delta", delta)
    session.run_with_iobinding(io)
    session.run_with_iobinding(io)                          # again: reads what the first run wrote
    want = np.zeros((4, 2, 5, 3), np.float32)
    want[1:3] = 2 * delta
    np.testing.assert_array_equal(cache.host_copy("past"), want)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_copy_prefix_copies_the_first_positions_of_every_head_and_nothing_else(provider: str) -> None:
    session = _add_in_place_session(provider)
    cache = CacheBuffers(["past", "other"], slots=3, kv_heads=2, max_length=5, head_dim=3, dtype=np.float32,
                         device=Device.of(session))
    rng = np.random.default_rng(0)
    filled = {}
    for name in ("past", "other"):       # fill through a run: the buffers are only reachable by binding
        io = session.io_binding()
        cache.bind(io, name, "past", "present", 0, 3)
        filled[name] = rng.standard_normal((3, 2, 5, 3)).astype(np.float32)
        io.bind_cpu_input("delta", filled[name])
        session.run_with_iobinding(io)
    cache.copy_prefix(source=0, target=2, length=3)
    for name, before in filled.items():
        want = before.copy()
        want[2, :, :3] = before[0, :, :3]
        np.testing.assert_array_equal(cache.host_copy(name), want)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_many_copies_at_once_equal_the_same_copies_one_by_one(provider: str) -> None:
    """A beam step's copies of every search go in one call (a gather and scatter per buffer on the host): the same
    buffers as copy_prefix one pair at a time; a slot both a source and a target is refused."""
    session = _add_in_place_session(provider)
    device = Device.of(session)
    filled = np.random.default_rng(2).standard_normal((5, 2, 5, 3)).astype(np.float32)
    caches = []
    for _ in range(2):
        cache = CacheBuffers(["past"], slots=5, kv_heads=2, max_length=5, head_dim=3, dtype=np.float32, device=device)
        io = session.io_binding()
        cache.bind(io, "past", "past", "present", 0, 5)
        io.bind_cpu_input("delta", filled)
        session.run_with_iobinding(io)
        caches.append(cache)
    together, one_by_one = caches
    together.copy_prefixes([0, 3, 1], [4, 2, 1], length=2)      # 1 -> 1: nothing to do
    for source, target in ((0, 4), (3, 2)):
        one_by_one.copy_prefix(source, target, 2)
    want = filled.copy()
    want[4, :, :2], want[2, :, :2] = filled[0, :, :2], filled[3, :, :2]
    np.testing.assert_array_equal(together.host_copy("past"), want)
    np.testing.assert_array_equal(one_by_one.host_copy("past"), want)
    with pytest.raises(ValueError, match="sources and targets"):
        together.copy_prefixes([0, 4], [4, 1], length=2)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_resized_buffers_keep_each_slots_first_positions_on_the_device(provider: str) -> None:
    """An encoder-decoder's cross buffers grow with the longest source and shrink back (cross_runner.py)."""
    session = _add_in_place_session(provider)
    cache = CacheBuffers(["past"], slots=3, kv_heads=2, max_length=5, head_dim=3, dtype=np.float32,
                         device=Device.of(session))
    filled = np.random.default_rng(1).standard_normal((3, 2, 5, 3)).astype(np.float32)
    io = session.io_binding()
    cache.bind(io, "past", "past", "present", 0, 3)
    io.bind_cpu_input("delta", filled)
    session.run_with_iobinding(io)
    longer = cache.resized(8)
    assert longer.shape == (3, 2, 8, 3) and longer.device == cache.device
    want = np.zeros((3, 2, 8, 3), np.float32)
    want[:, :, :5] = filled
    np.testing.assert_array_equal(longer.host_copy("past"), want)
    np.testing.assert_array_equal(longer.resized(2).host_copy("past"), filled[:, :, :2])


@pytest.mark.parametrize("provider", PROVIDERS)
def test_written_rows_land_in_their_slots_first_positions_and_nothing_else_changes(provider: str) -> None:
    """An encoder's output rows into the cross buffers (encoder_step.py): row r's every head at positions
    [0, length) of its slot (a row may go to several slots: a beam search's), the rest of each slot kept."""
    session = _add_in_place_session(provider)
    device = Device.of(session)
    cache = CacheBuffers(["past"], slots=6, kv_heads=2, max_length=5, head_dim=3, dtype=np.float32, device=device)
    before = np.random.default_rng(2).standard_normal((6, 2, 5, 3)).astype(np.float32)
    io = session.io_binding()
    cache.bind(io, "past", "past", "present", 0, 6)
    io.bind_cpu_input("delta", before)
    session.run_with_iobinding(io)
    rows = np.arange(3 * 2 * 3 * 3, dtype=np.float32).reshape(3, 2, 3, 3) + 100
    value = ort.OrtValue.ortvalue_from_numpy(rows, device.kind, device.index)
    cache.write_rows("past", value, [(0, 4), (2, 1), (2, 5), (1, 0)])
    cache.synchronize()
    want = before.copy()
    for row, slot in ((0, 4), (2, 1), (2, 5), (1, 0)):
        want[slot, :, :3] = rows[row]
    np.testing.assert_array_equal(cache.host_copy("past"), want)
    with pytest.raises(ValueError, match="out of range"):
        cache.write_rows("past", value, [(3, 0)])


def test_host_rows_written_from_an_array_land_as_from_an_output() -> None:
    """write_host_rows (the encoder's outputs bound into its own host buffers) writes what write_rows writes from
    the same values, and refuses what does not fit."""
    session = _add_in_place_session("CPUExecutionProvider")
    device = Device.of(session)
    caches = [CacheBuffers(["past"], slots=6, kv_heads=2, max_length=5, head_dim=3, dtype=np.float32, device=device)
              for _ in range(2)]
    rows = np.arange(3 * 2 * 3 * 3, dtype=np.float32).reshape(3, 2, 3, 3) + 100
    pairs = [(0, 4), (2, 1), (2, 5), (1, 0)]
    caches[0].write_rows("past", ort.OrtValue.ortvalue_from_numpy(rows), pairs)
    caches[1].write_host_rows("past", rows, pairs)
    np.testing.assert_array_equal(caches[0].host_copy("past"), caches[1].host_copy("past"))
    assert caches[1].host_copy("past")[4, :, :3].tolist() == rows[0].tolist()
    with pytest.raises(ValueError, match="out of range"):
        caches[1].write_host_rows("past", rows, [(3, 0)])
    with pytest.raises(ValueError, match="does not fit"):
        caches[1].write_host_rows("past", np.zeros((1, 2, 6, 3), np.float32), [(0, 0)])


def test_out_of_range_requests_are_refused() -> None:
    cache = CacheBuffers(["past"], slots=2, kv_heads=1, max_length=4, head_dim=2, dtype=np.float16, device=Device())
    with pytest.raises(ValueError, match="out of range"):
        cache.copy_prefix(0, 2, 1)
    with pytest.raises(ValueError, match="out of range"):
        cache.copy_prefix(0, 1, 5)
    with pytest.raises(ValueError, match=r"slots \[1, 3\)"):
        cache.bind(_add_in_place_session().io_binding(), "past", "past", "present", 1, 3)
    assert cache.nbytes == 2 * 1 * 4 * 2 * 2 and cache.host_copy("past").dtype == np.float16
