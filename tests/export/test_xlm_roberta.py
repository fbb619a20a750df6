"""XLM-RoBERTa against `transformers`: checkpoints written by transformers' XLMRoberta* classes from a small random
config, with a SentencePiece-style Unigram tokenizer trained here with `tokenizers` in XLMRobertaTokenizerFast's
layout (<s> <pad> </s> <unk> ... <mask>), exported for classify, fill-mask and token-classify and compared on a
padded batch (the ids from transformers' own tokenizer); our checkpoint loads back into transformers; a
sentence-transformers model over XLMRobertaModel exports for embed and equals SentenceTransformer.encode.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from export import ExportConfig, export_checkpoint
from tests.xlmr_models import hf_config, unigram_tokenizer

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)

TEXTS = ["Now is the winter of our discontent", "A horse! a horse! my kingdom for a horse!", "To be"]
HF_CLASSES = {"classify": "XLMRobertaForSequenceClassification", "fill-mask": "XLMRobertaForMaskedLM",
              "token-classify": "XLMRobertaForTokenClassification", "embed": "XLMRobertaModel"}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("xlmr")
    tokenizer = unigram_tokenizer(root / "tok")
    config = hf_config(len(tokenizer), id2label={0: "O", 1: "B-X", 2: "I-X"})   # tests/xlmr_models.py's shape
    out = {}
    for task, cls in HF_CLASSES.items():
        torch.manual_seed(0)
        d = root / task
        getattr(transformers, cls)(config).eval().save_pretrained(d)
        tokenizer.save_pretrained(d)
        out[task] = d
    return out


def _feeds(ckpt: Path, texts: list[str]) -> dict[str, np.ndarray]:
    tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    batch = tok(texts, padding=True, return_tensors="np")
    return {"input_ids": batch["input_ids"].astype(np.int64), "attention_mask": batch["attention_mask"].astype(np.int64)}


@pytest.mark.parametrize("task", ["classify", "fill-mask", "token-classify"])
def test_exported_xlm_roberta_equals_transformers(checkpoints, tmp_path: Path, task: str) -> None:
    from tests.conftest import one_torch_thread

    ckpt = checkpoints[task]
    with one_torch_thread():
        package = export_checkpoint(ExportConfig(checkpoint=ckpt, task=task, repository=tmp_path,
                                                 name="xlmr")).package_dir
    manifest = json.loads((package / "model.json").read_text())
    assert manifest["architecture"] == "xlm-roberta"
    assert [t["name"] for t in manifest["inputs"]] == ["input_ids", "attention_mask"]   # no token types
    assert manifest["special_tokens"]["pad"] == 1 and manifest["special_tokens"]["mask"] == 300
    texts = [t.replace("winter", "<mask>") for t in TEXTS] if task == "fill-mask" else TEXTS
    feeds = _feeds(ckpt, texts)
    real = feeds["attention_mask"].astype(bool)
    assert (~real).any()  # padding is exercised
    hf = getattr(transformers, HF_CLASSES[task]).from_pretrained(ckpt).eval()
    with torch.no_grad():
        ref = hf(**{k: torch.from_numpy(v) for k, v in feeds.items()}).logits.numpy()
    session = ort.InferenceSession(str(package / manifest["variants"]["fp32"]), providers=["CPUExecutionProvider"])
    got = session.run(None, feeds)[0]
    assert got.shape == ref.shape
    diff = np.abs(got - ref)[real] if task != "classify" else np.abs(got - ref)
    assert float(diff.max()) <= 1e-4, float(diff.max())
    assert float(np.abs(ref[0] - ref[1]).max()) > 1e-3   # inputs move the logits: not two constants compared


def test_our_xlm_roberta_checkpoint_loads_in_transformers(checkpoints, tmp_path: Path) -> None:
    from training.checkpoint import load_model, save_model

    for task, auto in (("classify", "AutoModelForSequenceClassification"), ("fill-mask", "AutoModelForMaskedLM")):
        ours, _ = load_model(checkpoints[task])
        with torch.no_grad():  # make every weight differ from the file it came from
            for p in ours.parameters():
                p.add_(0.01 * torch.randn_like(p))
        save_model(ours, tmp_path / task)
        assert json.loads((tmp_path / task / "config.json").read_text())["model_type"] == "xlm-roberta"
        hf, info = getattr(transformers, auto).from_pretrained(tmp_path / task, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
        assert type(hf).__name__ == HF_CLASSES[task]
        feeds = {k: torch.from_numpy(v) for k, v in _feeds(checkpoints[task], TEXTS).items()}
        with torch.no_grad():
            d = (hf.eval()(**feeds).logits - ours(**feeds)).abs()
        real = feeds["attention_mask"].bool()
        assert float((d[real] if task == "fill-mask" else d).max()) <= 1e-5


def test_sentence_transformers_over_xlm_roberta_model_exports_for_embed(checkpoints, tmp_path: Path) -> None:
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.sentence_transformer import modules
    from tests.conftest import one_torch_thread

    transformer = modules.Transformer(str(checkpoints["embed"]))
    model = st.SentenceTransformer(modules=[transformer, modules.Pooling(32, pooling_mode="mean"),
                                            modules.Normalize()], device="cpu")
    model.save(str(tmp_path / "st"))
    assert json.loads((tmp_path / "st" / "config.json").read_text())["architectures"] == ["XLMRobertaModel"]
    with one_torch_thread():
        result = export_checkpoint(ExportConfig(checkpoint=tmp_path / "st", task="embed", repository=tmp_path / "repo",
                                                name="xlmr-embed"))
    assert result.parity["variants"]["fp32"]["reference"] == "sentence-transformers"
    manifest = json.loads((result.package_dir / "model.json").read_text())
    session = ort.InferenceSession(str(result.package_dir / manifest["variants"]["fp32"]),
                                   providers=["CPUExecutionProvider"])
    got = session.run(["embeddings"], _feeds(tmp_path / "st", TEXTS))[0]
    ref = st.SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(TEXTS)
    assert got.shape == ref.shape == (3, 32)
    np.testing.assert_allclose(got, ref, atol=1e-5)
