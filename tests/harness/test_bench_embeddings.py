"""bench/embeddings.py's peer material: infinity-emb gets our embed graph cut before its pooling; mean-pooling and
normalising its hidden states in numpy (what infinity does) must give the package's own vectors, or the
benchmark would compare two different models."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from bench.embeddings import cut_before_pooling, render


def test_graph_cut_before_the_pooling_gives_the_packages_vectors(tiny_checkpoints, tmp_path: Path) -> None:
    from tests.conftest import one_torch_thread

    from export import ExportConfig, export_checkpoint

    with one_torch_thread():
        package = export_checkpoint(ExportConfig(checkpoint=tiny_checkpoints.mlm, task="embed", repository=tmp_path,
                                                 name="emb", pooling="mean", normalize="on")).package_dir
    cut_before_pooling(package / "model.onnx", tmp_path / "cut.onnx")
    ids = np.array([[2, 40, 41, 42, 3, 0, 0], [2, 50, 51, 52, 53, 54, 3]], np.int64)
    mask = (ids != 0).astype(np.int64)
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    whole = ort.InferenceSession(str(package / "model.onnx"))
    cut = ort.InferenceSession(str(tmp_path / "cut.onnx"))
    assert [o.name for o in cut.get_outputs()] == ["last_hidden_state"]
    names = {i.name for i in whole.get_inputs()}
    want = whole.run(None, {k: v for k, v in feeds.items() if k in names})[0]
    hidden = cut.run(None, {k: v for k, v in feeds.items() if k in names})[0]
    pooled = (hidden * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)
    np.testing.assert_allclose(pooled / np.linalg.norm(pooled, axis=1, keepdims=True), want, atol=1e-5)


def test_report_marks_goals_per_cell() -> None:
    cell = lambda o, i, po, pi: {"median": {"ortserve": {"embeddings_per_s": o, "p50_ms": po, "p90_ms": po},
                                            "infinity": {"embeddings_per_s": i, "p50_ms": pi, "p90_ms": pi}},
                                 "ratio": o / i}
    result = {"machine": {"cpu_model": "cpu", "nproc": 2, "git_commit": "abc", "loadavg_at_start": [0.1]},
              "command": "python -m bench.embeddings", "at": "now", "cosine_min": 0.9999,
              "config": {"rounds": 3, "seconds": 6.0}, "sides": {"ortserve": "o", "infinity": "i"},
              "cells": {"1x1": cell(130, 100, 6.0, 7.0), "8x32": cell(110, 100, 9.0, 8.0)}}
    rows = [line for line in render(result) if line.startswith("| 1 ×") or line.startswith("| 8 ×")]
    assert rows[0].endswith("| 1.30 | met | 6.0 / 7.0 | met |")
    assert rows[1].endswith("| 1.10 | **missed** | 9.0 / 8.0 | **missed** |")
