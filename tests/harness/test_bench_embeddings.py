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


def test_base_shape_report_with_an_fp32_side_gives_both_ratios_and_both_cosines() -> None:
    def cell(o: float, o32: float, i: float) -> dict:
        med = {side: {"embeddings_per_s": v, "p50_ms": 9.0, "p90_ms": 9.0}
               for side, v in (("ortserve", o), ("ortserve_fp32", o32), ("infinity", i))}
        return {"median": med, "ratio": o / i, "ratio_fp32": o32 / i}

    result = {"machine": {"cpu_model": "cpu", "nproc": 2, "git_commit": "abc", "loadavg_at_start": [0.1]},
              "command": "python -m bench embeddings --model modernbert", "at": "now", "model": "modernbert",
              "variant": "int8", "cosine_min": 0.9994, "cosine": {"ortserve": 0.9994, "ortserve_fp32": 1.0},
              "config": {"rounds": 3, "seconds": 8.0, "infinity_engine": "optimum"},
              "sides": {"ortserve": "o", "ortserve_fp32": "o32", "infinity": "i"},
              "cells": {"1x1": cell(15.0, 11.0, 10.0), "1x8": cell(13.0, 10.0, 10.0), "8x8": cell(11.0, 9.0, 10.0)}}
    lines = render(result)
    assert any(line.startswith("| clients × texts per request | ortserve (int8) emb/s | ortserve fp32 emb/s |")
               for line in lines)
    assert any("int8 0.999400, fp32 1.000000" in line for line in lines)
    rows = [line for line in lines if line.startswith("| 1 ×") or line.startswith("| 8 ×")]
    assert rows[1].startswith("| 1 × 8 | 13.0 | 10.0 | 10.0 | 1.30 | 1.00 | met |")
    assert rows[2].startswith("| 8 × 8 | 11.0 | 9.0 | 10.0 | 1.10 | 0.90 | **missed** |")


def test_classify_pipeline_report_with_int8_gives_the_fp32_ratio_and_the_gate_figures() -> None:
    from bench.classify_pipeline import render as render_classify

    cell = lambda o, o32, p: {"median": {"ortserve": o, "ortserve_fp32": o32, "pipeline": p, "graph": o,
                                         "torch_forward": p}, "ratio": o / p, "ceiling": o / p}
    result = {"machine": {"cpu_model": "cpu", "nproc": 2, "git_commit": "abc", "loadavg_at_start": [0.1]},
              "command": "python -m bench classify_pipeline", "at": "now", "agree": [16, 16], "score_diff": 1e-4,
              "variant": "int8", "rounds": 3, "seconds": 8.0, "torch_threads": 2, "hf_attention": "eager",
              "int8_gate": {"status": "passed", "top1": 1.0, "top1_detail": "324/324 held-out inputs",
                            "accuracy_detail": "fp32 0.4033, variant 0.4033 on 300 labelled examples"},
              "cells": {"1": cell(30.0, 20.0, 5.0), "8": cell(32.0, 24.0, 16.0)}}
    lines = render_classify(result)
    assert any("top-1 agreement 1.0000 (324/324 held-out inputs)" in line and "on 300 labelled" in line
               for line in lines)
    rows = [line for line in lines if line.startswith("| 8 |")]
    assert rows[0].startswith("| 8 | 32.00 | 24.00 | 16.00 | 2.00 | 1.50 | met |")
