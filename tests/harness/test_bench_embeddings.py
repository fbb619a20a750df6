"""bench/embeddings.py's peer material: infinity-emb gets our embed graph cut before its pooling; mean-pooling and
normalising its hidden states in numpy (what infinity does) must give the package's own vectors, or the
benchmark would compare two different models. Its report, and bench/classify_pipeline.py's, mark goals per cell."""
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


def test_base_shape_report_marks_the_goal_at_batch_8_and_names_the_model_and_threads() -> None:
    cell = lambda o, i: {"median": {"ortserve": {"embeddings_per_s": o, "p50_ms": 9.0, "p90_ms": 9.0},
                                    "infinity": {"embeddings_per_s": i, "p50_ms": 8.0, "p90_ms": 8.0}},
                         "ratio": o / i}
    result = {"machine": {"cpu_model": "cpu", "nproc": 2, "git_commit": "abc", "loadavg_at_start": [0.1]},
              "command": "python -m bench embeddings --model xlmr", "at": "now", "cosine_min": 0.9999, "model": "xlmr",
              "config": {"rounds": 3, "seconds": 6.0, "infinity_engine": "optimum"},
              "sides": {"ortserve": "o; 9 OS threads in the process", "infinity": "i; 31 OS threads in the process"},
              "cells": {"1x1": cell(10.0, 20.0), "1x8": cell(30.0, 20.0), "8x8": cell(22.0, 20.0)}}
    lines = render(result)
    assert "xlmr" in lines[0] and any("XLMRobertaModel 12 layers x 768" in line for line in lines)
    assert any("9 OS threads" in line for line in lines) and any("31 OS threads" in line for line in lines)
    rows = [line for line in lines if line.startswith("| 1 ×") or line.startswith("| 8 ×")]
    assert "| 0.50 | — |" in rows[0]                  # batch 1: no goal
    assert "| 1.50 | met |" in rows[1]
    assert "| 1.10 | **missed** |" in rows[2]


def test_classify_pipeline_report_marks_the_goal_at_batch_8() -> None:
    from bench.classify_pipeline import render as render_classify

    cell = lambda o, p: {"median": {"ortserve": o, "pipeline": p, "graph": o * 1.1, "torch_forward": p * 1.1},
                         "ratio": o / p, "ceiling": o * 1.1 / p}
    result = {"machine": {"cpu_model": "cpu", "nproc": 2, "git_commit": "abc", "loadavg_at_start": [0.1]},
              "command": "python -m bench classify_pipeline", "at": "now", "agree": [16, 16], "score_diff": 1e-5,
              "variant": "fp32", "rounds": 3, "seconds": 6.0, "torch_threads": 2, "hf_attention": "eager",
              "cells": {"1": cell(10.0, 5.0), "8": cell(14.0, 10.0)}}
    lines = render_classify(result)
    assert any("DebertaV2ForSequenceClassification 12 layers x 768" in line for line in lines)
    rows = [line for line in lines if line.startswith("| 1 |") or line.startswith("| 8 |")]
    assert "| 2.00 | — |" in rows[0]
    assert "| 1.40 | **missed** |" in rows[1]
