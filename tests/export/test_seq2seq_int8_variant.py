"""The int8 encoder-decoder variant: per-channel 7-bit weights (int8 codes) x per-token uint8 activations in both
graphs (export/seq2seq_quantized.py, export/int8.py's rewrite), the head included.

A random Hugging Face Marian exported with --variants int8: every fp32 weight product became a
MatMulIntegerToFloat, the gate judged it on held-out sources with the 8-bit limits and timed it for the CPU
default; served with --variant int8, greedy answers of a batch equal an offline run of the same graphs one source at
a time (one activation scale per row: a row's numbers do not depend on its neighbours), and the OpenAI door answers
from it too.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from export import ExportConfig, Tolerances, export_checkpoint
from tests.server_process import ROOT, ServerProcess

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

SOURCES = ["hello world", "a", "the quick brown fox", "translation, at last!", "int8 rows on their own"]
NEW = 9


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from testing.seq2seq_checkpoints import write_checkpoint

    return write_checkpoint("marian", tmp_path_factory.mktemp("i8-ckpt") / "marian")


@pytest.fixture(scope="module")
def package(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return export_checkpoint(ExportConfig(checkpoint=checkpoint, task="generate",
                                              repository=tmp_path_factory.mktemp("i8-repo"), name="marian",
                                              variants=("fp32", "int8"))).package_dir
    finally:
        torch.set_num_threads(before)


def _ops(path: Path) -> Counter:
    return Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def test_int8_rewrites_every_weight_product_and_the_gate_records_it(package: Path) -> None:
    manifest = json.loads((package / "model.json").read_text())
    parity = json.loads((package / "parity.json").read_text())
    graphs = manifest["encoder_decoder"]["graphs"]
    assert graphs["int8"] == {"encoder": "encoder.int8.onnx", "decoder": "decoder.int8.onnx"}
    assert manifest["variants"] == {"fp32": "decoder.onnx", "int8": "decoder.int8.onnx"}
    q = manifest["quantization"]["int8"]
    assert q["method"] == "MatMulIntegerToFloat" and q["head"] == "int8" and q["graphs"] == ["encoder", "decoder"]
    for side in ("encoder", "decoder"):
        fp32, int8 = _ops(package / graphs["fp32"][side]), _ops(package / graphs["int8"][side])
        # every fp32 weight MatMul (and the decoder's FusedMatMul head) is now one integer product with its row scales
        assert int8["MatMulIntegerToFloat"] == fp32["MatMul"] + fp32["FusedMatMul"], (side, int8)
        assert int8["MatMul"] == 0 and int8["FusedMatMul"] == 0 and int8["QuantizeLinear"] > 0, (side, int8)
    # the head writes `logits` itself: no Reshape (a copy of [rows, vocab] into the bound buffer) after it
    for variant in ("fp32", "int8"):
        graph = onnx.load(str(package / graphs[variant]["decoder"])).graph
        assert next(n for n in graph.node if "logits" in n.output).op_type in ("FusedMatMul", "Mul"), variant
    head = onnx.load(str(package / graphs["int8"]["decoder"]))
    weights = {i.name: i for i in head.graph.initializer}
    assert weights["lm_head.weight_t/int8"].data_type == onnx.TensorProto.INT8
    result = parity["variants"]["int8"]
    assert result["passed"] is True
    checks = {c["name"].split(" (")[0]: c for c in result["checks"]}
    limits = Tolerances()
    assert checks["greedy: identical outputs"]["threshold"] == limits.seq2seq_w8_min_identical
    assert checks["perplexity ratio"]["threshold"] == limits.seq2seq_w8_max_perplexity_ratio
    assert 0.9 < checks["perplexity ratio"]["value"] <= limits.seq2seq_w8_max_perplexity_ratio
    # timed beside fp32 for the CPU default, by the exporter's rule
    from export.speed import pick_fastest

    times = {v: parity["variants"][v]["step_ms"] for v in ("fp32", "int8")}
    assert manifest["default_variant"]["cpu"] == pick_fastest(times) == parity["speed"]["fastest"]


def test_a_perturbed_int8_decoder_is_refused_and_the_package_keeps_fp32(checkpoint: Path, tmp_path: Path) -> None:
    env = {**os.environ, "ORTSERVE_EXPORT_PERTURB": "int8", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "export", str(checkpoint), "--task", "generate", "--repository",
                          str(tmp_path), "--name", "marian", "--variants", "int8"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]    # fp32 passed: published without int8
    assert "refused int8" in run.stderr
    pkg = tmp_path / "marian" / "1"
    result = json.loads((pkg / "parity.json").read_text())["variants"]["int8"]
    assert result["passed"] is False and result["status"].startswith("refused: ")
    ratio = next(c for c in result["checks"] if c["name"].startswith("perplexity ratio"))
    assert ratio["value"] - 1 > 10 * (ratio["threshold"] - 1)      # far outside, not near the limit
    assert json.loads((pkg / "model.json").read_text())["variants"] == {"fp32": "decoder.onnx"}
    assert sorted(p.name for p in pkg.glob("*.onnx")) == ["decoder.onnx", "encoder.onnx"]


@pytest.fixture(scope="module")
def served(package: Path):
    with ServerProcess(package.parent.parent, ["--variant", "int8", "--max-sequences", "4", "--http-port", "0"]) \
            as proc:
        yield proc


def test_served_int8_batch_equals_offline_rows_alone(served: ServerProcess, package: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from tokenizers import Tokenizer

    from clients import OrtserveClient
    from testing.seq2seq_offline import greedy, load_package, stepped_logits

    with OrtserveClient(served.address, timeout=60) as client:
        assert {m.name: m for m in client.list_models()}["marian"].variant == "int8"
        with ThreadPoolExecutor(len(SOURCES)) as pool:     # more sources than slots: rows join and leave
            answers = list(pool.map(lambda s: client.generate(s, "marian", max_new_tokens=NEW), SOURCES))
    pkg, fp32 = load_package(package, variant="int8"), load_package(package)
    source = Tokenizer.from_file(str(package / "tokenizer.json"))
    want = [greedy(pkg, source.encode(s).ids, NEW) for s in SOURCES]
    assert [[t.token_id for t in a.tokens] for a in answers] == want
    # the int8 graphs answered: their logits are not fp32's, and not far from them either
    ids = source.encode(SOURCES[2]).ids
    target = [pkg.spec.decoder_start_token_id, *want[2][:-1]]
    diff = float(np.abs(stepped_logits(pkg, ids, target) - stepped_logits(fp32, ids, target)).max())
    assert 1e-4 < diff < 0.5


def test_the_openai_door_answers_from_int8(served: ServerProcess) -> None:
    import openai

    from clients import OrtserveClient

    client = openai.OpenAI(base_url=f"{served.http_url}/v1", api_key="none")
    answer = client.completions.create(model="marian", prompt=SOURCES[3], max_tokens=NEW, temperature=0)
    with OrtserveClient(served.address, timeout=60) as grpc_client:
        want = grpc_client.generate(SOURCES[3], "marian", max_new_tokens=NEW)   # equal to offline int8 (above)
    assert answer.choices[0].text == want.text and answer.usage.completion_tokens == len(want.tokens)
