"""The in-place cache's device buffers (server/generation/device_cache.py) on the host device: the code path
the CUDA provider takes too, with only the memory calls differing (docs/GPU.md for the GPU run)."""
from __future__ import annotations

import numpy as np
import onnx
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


def test_out_of_range_requests_are_refused() -> None:
    cache = CacheBuffers(["past"], slots=2, kv_heads=1, max_length=4, head_dim=2, dtype=np.float16, device=Device())
    with pytest.raises(ValueError, match="out of range"):
        cache.copy_prefix(0, 2, 1)
    with pytest.raises(ValueError, match="out of range"):
        cache.copy_prefix(0, 1, 5)
    with pytest.raises(ValueError, match=r"slots \[1, 3\)"):
        cache.bind(_add_in_place_session().io_binding(), "past", "past", "present", 1, 3)
    assert cache.nbytes == 2 * 1 * 4 * 2 * 2 and cache.host_copy("past").dtype == np.float16
