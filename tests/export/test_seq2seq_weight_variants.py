"""Weight-quantized encoder-decoder variants (w8 / w4: MatMulNBits in both graphs, export/seq2seq_quantized.py).

A random Hugging Face Marian (testing/seq2seq_checkpoints.py) exported with --variants w8: the variant's graphs
are quantized (no fp32 weight MatMul or FusedMatMul head left), judged by the gate on held-out sources and recorded; a
variant that breaches its limits (an impossible limit, a perturbed graph) is refused with its figures while the
package keeps fp32; served with --variant w8, greedy answers equal an offline run of the same quantized graphs
(testing/seq2seq_offline.py, plain sessions) and a beam search answers with its n-best.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from export import ExportConfig, Tolerances, export_checkpoint
from tests.server_process import ROOT, ServerProcess

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

SOURCES = ["hello world", "a", "the quick brown fox", "translation, at last!"]
NEW = 9


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from testing.seq2seq_checkpoints import write_checkpoint

    return write_checkpoint("marian", tmp_path_factory.mktemp("s2q-ckpt") / "marian")


def _export(checkpoint: Path, repo: Path, variants=("fp32", "w8"), **kw):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return export_checkpoint(ExportConfig(checkpoint=checkpoint, task="generate", repository=repo, name="marian",
                                              variants=variants, **kw))
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def package(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _export(checkpoint, tmp_path_factory.mktemp("s2q-repo")).package_dir


def _ops(path: Path) -> Counter:
    return Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def test_w8_quantizes_both_graphs_and_the_gate_records_what_it_changes(package: Path) -> None:
    manifest = json.loads((package / "model.json").read_text())
    parity = json.loads((package / "parity.json").read_text())
    graphs = manifest["encoder_decoder"]["graphs"]
    assert graphs["w8"] == {"encoder": "encoder.w8.onnx", "decoder": "decoder.w8.onnx"}
    assert manifest["variants"] == {"fp32": "decoder.onnx", "w8": "decoder.w8.onnx"}
    assert manifest["quantization"]["w8"]["bits"] == 8 and manifest["quantization"]["w8"]["graphs"] == ["encoder",
                                                                                                         "decoder"]
    for side in ("encoder", "decoder"):
        fp32, w8 = _ops(package / graphs["fp32"][side]), _ops(package / graphs["w8"][side])
        assert w8["MatMulNBits"] > 0 and w8["MatMul"] == 0 and w8["FusedMatMul"] == 0, (side, w8)
        # every fp32 weight MatMul (and the decoder's FusedMatMul head) became one MatMulNBits
        assert w8["MatMulNBits"] == fp32["MatMul"] + fp32["FusedMatMul"], side
    assert (package / "decoder.w8.onnx").stat().st_size < 0.6 * (package / "decoder.onnx").stat().st_size
    w8 = parity["variants"]["w8"]
    assert w8["passed"] is True
    checks = {c["name"].split(" (")[0]: c for c in w8["checks"]}
    identical, ratio = checks["greedy: identical outputs"], checks["perplexity ratio"]
    limits = Tolerances()
    assert identical["threshold"] == limits.seq2seq_w8_min_identical and identical["value"] >= identical["threshold"]
    assert ratio["threshold"] == limits.seq2seq_w8_max_perplexity_ratio and 0.9 < ratio["value"] <= ratio["threshold"]
    assert "72 held-out sources" in identical["detail"] and "mean KL" in ratio["detail"]
    # both variants timed for the CPU default; the default is the faster one by the exporter's rule
    from export.speed import pick_fastest

    times = {v: parity["variants"][v]["step_ms"] for v in ("fp32", "w8")}
    assert manifest["default_variant"] == {"cpu": pick_fastest(times), "cuda": "fp32"}
    assert parity["speed"]["fastest"] == manifest["default_variant"]["cpu"]


def test_a_variant_breaching_its_limit_is_refused_and_the_package_keeps_fp32(checkpoint: Path, tmp_path: Path) -> None:
    impossible = replace(Tolerances(), seq2seq_w8_min_identical=1.01)   # more than every output identical
    result = _export(checkpoint, tmp_path, tolerances=impossible)
    pkg = result.package_dir
    manifest = json.loads((pkg / "model.json").read_text())
    assert manifest["variants"] == {"fp32": "decoder.onnx"} and list(manifest["encoder_decoder"]["graphs"]) == ["fp32"]
    assert "quantization" not in manifest and manifest["default_variant"] == {"cpu": "fp32", "cuda": "fp32"}
    assert sorted(p.name for p in pkg.glob("*.onnx")) == ["decoder.onnx", "encoder.onnx"]
    w8 = result.parity["variants"]["w8"]
    assert w8["status"].startswith("refused: greedy: identical outputs (w8 / PyTorch fp32)") and "limit 1.01" in \
        w8["status"]
    assert w8["checks"][0]["value"] > 0.5      # its figures are kept: a good variant, refused by the limit alone


def test_a_perturbed_w8_decoder_is_refused_with_its_figures(checkpoint: Path, tmp_path: Path) -> None:
    env = {**os.environ, "ORTSERVE_EXPORT_PERTURB": "w8", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "export", str(checkpoint), "--task", "generate", "--repository",
                          str(tmp_path), "--name", "marian", "--variants", "w8"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]    # fp32 passed: the package is published without w8
    assert "refused w8" in run.stderr
    parity = json.loads((tmp_path / "marian" / "1" / "parity.json").read_text())
    w8 = parity["variants"]["w8"]
    assert w8["passed"] is False and w8["status"].startswith("refused: ")
    ratio = next(c for c in w8["checks"] if c["name"].startswith("perplexity ratio"))
    # a broken graph is far outside (10x the 1% excess allowed), not near the limit
    assert ratio["value"] - 1 > 10 * (ratio["threshold"] - 1)
    assert json.loads((tmp_path / "marian" / "1" / "model.json").read_text())["variants"] == {"fp32": "decoder.onnx"}


def test_unknown_variants_are_refused_in_one_line(checkpoint: Path, tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "export", str(checkpoint), "--task", "generate", "--repository",
                          str(tmp_path), "--name", "m", "--variants", "kv8"], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert "--variants: an encoder-decoder package ships fp32, w8, w4" in run.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def served(package: Path):
    with ServerProcess(package.parent.parent, ["--variant", "w8", "--max-sequences", "6"]) as proc:
        yield proc


def test_served_w8_equals_offline_decoding_of_the_same_graphs_and_beams_answer(served: ServerProcess,
                                                                              package: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from tokenizers import Tokenizer

    from clients import OrtserveClient
    from testing.seq2seq_offline import greedy, load_package, stepped_logits

    with OrtserveClient(served.address, timeout=60) as client:
        status = {m.name: m for m in client.list_models()}["marian"]
        assert status.variant == "w8"
        with ThreadPoolExecutor(4) as pool:     # batched together in the engine
            answers = list(pool.map(lambda s: client.generate(s, "marian", max_new_tokens=NEW), SOURCES))
        beams = client.generate(SOURCES[2], "marian", max_new_tokens=NEW, num_beams=4)
    cli = subprocess.run([sys.executable, "-m", "clients", "--address", served.address, "models"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and any(line.split()[:1] == ["marian"] and "w8" in line.split()
                                       for line in cli.stdout.splitlines()), cli.stdout
    pkg, fp32 = load_package(package, variant="w8"), load_package(package)
    assert pkg.encoder.get_inputs()[0].name == "input_ids"
    source = Tokenizer.from_file(str(package / "tokenizer.json"))
    got = [[t.token_id for t in a.tokens] for a in answers]
    want = [greedy(pkg, source.encode(s).ids, NEW) for s in SOURCES]
    assert got == want
    # the quantized graphs are what answered: their logits differ from fp32's (not just the same graph twice)
    ids = source.encode(SOURCES[2]).ids
    target = [pkg.spec.decoder_start_token_id, *want[2][:-1]]
    q, f = stepped_logits(pkg, ids, target), stepped_logits(fp32, ids, target)
    assert 1e-4 < float(np.abs(q - f).max()) < 0.5
    # beam 4 on the quantized graphs: its hypothesis scores (sum of log-probabilities / length, the search's own
    # ranking with length_penalty 1) at least the greedy answer's there (deterministic: fixed weights and sources)
    best = [t.token_id for t in beams.tokens]
    assert best and len(best) <= NEW and beams.finish_reason in ("eos", "length")

    def score(seq: list[int]) -> float:
        rows = stepped_logits(pkg, ids, [pkg.spec.decoder_start_token_id, *seq[:-1]]).astype(float)
        rows -= rows.max(1, keepdims=True)
        rows -= np.log(np.exp(rows).sum(1, keepdims=True))
        return float(sum(rows[i, t] for i, t in enumerate(seq))) / len(seq)
    assert score(best) >= score(want[2]) - 1e-4


def test_validate_rechecks_the_published_variant(package: Path) -> None:
    from export.validate import validate_package

    passed, table = validate_package(package)
    assert passed, table
    assert "w8" in table and "perplexity ratio (w8 / PyTorch fp32)" in table
