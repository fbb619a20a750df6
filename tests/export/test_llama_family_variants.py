"""Issue 39: a Qwen3 (q/k norm, head_dim 32 apart from hidden / heads, llama3 rope scaling past an original context
of 16) given the same 100 Adam steps as the Llama of test_decoder_weight_variants.py, exported with the w8 and w4
weight variants: the gate judges each against PyTorch fp32 (perplexity ratio, greedy agreement, the mixed graph)
and the package records them as MatMulNBits graphs."""
from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from export import ExportConfig, export_checkpoint
from tests.conftest import one_torch_thread
from tests.export.test_decoder_weight_variants import _tiny_llama

LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}


@pytest.fixture(scope="module")
def package(tiny_checkpoints, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("qwen3-quantized")
    with one_torch_thread():
        ckpt = _tiny_llama(tiny_checkpoints, root / "qwen3", model_type="qwen3", head_dim=32,
                           rope_parameters=LLAMA3)
    assert json.loads((ckpt / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    r = export_checkpoint(ExportConfig(checkpoint=ckpt, task="generate", repository=root / "repo", name="qwen3-q",
                                       variants=("fp32", "w8", "w4")))
    return r.package_dir


@pytest.mark.parametrize("variant, bits", [("w8", 8), ("w4", 4)])
def test_qwen3_weight_variants_pass_the_gate(package: Path, variant: str, bits: int) -> None:
    m = json.loads((package / "model.json").read_text())
    r = json.loads((package / "parity.json").read_text())["variants"][variant]
    assert r["passed"] is True and r["status"] == "passed", r
    checks = {c["name"]: c for c in r["checks"]}
    ratio = checks[f"perplexity ratio ({variant} / PyTorch fp32)"]
    assert ratio["passed"] and 0.8 < ratio["value"] <= ratio["threshold"]
    assert checks["mixed graph: decode rows and a prompt chunk in one run"]["passed"]
    assert r["max_abs_diff"]["logits"] > 1e-4    # quantized: not the fp32 graph compared with itself
    nodes = onnx.load(str(package / m["variants"][variant])).graph.node
    nbits = [n for n in nodes if n.op_type == "MatMulNBits" and not n.name.startswith("lm_head")]
    assert nbits and all({a.name: a.i for a in n.attribute}["bits"] == bits for n in nbits)
    assert [n.op_type for n in nodes if n.op_type in ("MatMul", "Gemm")] == []
    assert m["cache"]["head_dim"] == 32 and m["architecture"] == "qwen3"
