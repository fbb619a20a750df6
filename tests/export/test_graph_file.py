"""export/graph_file.py: a graph past the protobuf limit is written with its weights in `<file>.data`, which
onnxruntime and the server's package check read; smaller graphs stay one file."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from export import graph_file
from server.repository.external_data import external_data_files


def _matmul_model(w: np.ndarray) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, w.shape[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, w.shape[1]])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_a_large_graph_goes_to_external_data_and_runs_the_same(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    model = _matmul_model(w)
    assert graph_file.initializer_bytes(model) == w.nbytes
    graph_file.save_checked(model, tmp_path / "small.onnx")
    assert not (tmp_path / "small.onnx.data").exists() and external_data_files(tmp_path / "small.onnx") == []

    monkeypatch.setattr(graph_file, "EXTERNAL_ABOVE", w.nbytes - 1)   # this graph now counts as too large
    graph_file.save_checked(graph_file.copy_model(model), tmp_path / "big.onnx")
    assert (tmp_path / "big.onnx.data").stat().st_size == w.nbytes
    assert (tmp_path / "big.onnx").stat().st_size < 1000
    assert external_data_files(tmp_path / "big.onnx") == ["big.onnx.data"]
    # readable by the users the graph is readable by (onnx alone creates the data file owner-only)
    assert (tmp_path / "big.onnx.data").stat().st_mode & 0o777 == (tmp_path / "big.onnx").stat().st_mode & 0o777
    np.testing.assert_array_equal(_run(tmp_path / "big.onnx", x), _run(tmp_path / "small.onnx", x))
    np.testing.assert_allclose(_run(tmp_path / "big.onnx", x), x @ w, rtol=1e-5, atol=1e-5)
    # saved again over an existing file: the data file is rewritten, not appended to
    graph_file.save_checked(_matmul_model(w), tmp_path / "big.onnx")
    assert (tmp_path / "big.onnx.data").stat().st_size == w.nbytes


def test_copy_model_is_deep() -> None:
    model = _matmul_model(np.ones((4, 4), np.float32))
    copy = graph_file.copy_model(model)
    copy.graph.initializer[0].raw_data = np.zeros((4, 4), np.float32).tobytes()
    assert numpy_helper.to_array(model.graph.initializer[0]).sum() == 16
