"""The head activation the export records (export/head_activation.py) against the libraries that decide it: the
transformers text-classification pipeline's default `function_to_apply` for each problem_type and label count, and
sentence-transformers' CrossEncoder for its saved activation keys (config.json `sentence_transformers.activation_fn`,
the older `sbert_ce_default_activation_function`); what cannot be served exactly is refused by name."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from export import ExportConfig, export_checkpoint
from export.errors import ExportError
from export.head_activation import head_activation
from server.encoders.activation import apply

transformers = pytest.importorskip("transformers")

CASES = [(None, 3), (None, 1), ("single_label_classification", 3), ("multi_label_classification", 3), ("multi_label_classification", 1), ("regression", 1), ("regression", 2)]


def _tiny(num_labels: int, problem_type: str | None, vocab: int = 32, **extra):
    config = transformers.BertConfig(vocab_size=vocab, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                                     intermediate_size=8, max_position_embeddings=64, num_labels=num_labels,
                                     problem_type=problem_type, **extra)
    return transformers.BertForSequenceClassification(config).eval()


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import family_tokenizers

    return family_tokenizers(tmp_path_factory.mktemp("tok"))["wordpiece"]


def _checkpoint(model, tokenizer_dir: Path, out: Path) -> Path:
    model.save_pretrained(out)
    for f in tokenizer_dir.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    return out


@pytest.mark.parametrize("problem_type,num_labels", CASES)
def test_activation_is_the_pipeline_default(problem_type: str | None, num_labels: int, wordpiece: Path,
                                            tmp_path: Path) -> None:
    """Scores of the same logits under the recorded activation equal the pipeline's postprocess with its default."""
    from transformers import AutoTokenizer, TextClassificationPipeline

    torch.manual_seed(0)
    model = _tiny(num_labels, problem_type, vocab=500)
    ckpt = _checkpoint(model, wordpiece, tmp_path / "ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    recorded = head_activation(ckpt, config)
    assert recorded.get("problem_type") == problem_type
    pipe = TextClassificationPipeline(model=model, tokenizer=AutoTokenizer.from_pretrained(str(ckpt)), device="cpu")
    logits = torch.tensor([[2.5, -1.0, 0.3][:num_labels]])
    want = pipe.postprocess({"logits": logits}, top_k=None)
    got = apply(logits.numpy()[0], recorded["function_to_apply"])
    labels = [model.config.id2label[i] for i in range(num_labels)]
    np.testing.assert_allclose([dict(zip(labels, got))[d["label"]] for d in want], [d["score"] for d in want],
                               atol=1e-6)


@pytest.mark.parametrize("key,path,expected", [
    ("sentence_transformers", "torch.nn.modules.linear.Identity", "none"),
    ("sentence_transformers", "torch.nn.modules.activation.Sigmoid", "sigmoid"),
    ("sbert_ce_default_activation_function", "torch.nn.modules.linear.Identity", "none"),
    ("sbert_ce_default_activation_function", "torch.nn.modules.activation.Sigmoid", "sigmoid"),
])
def test_cross_encoder_keys_read_as_sentence_transformers_reads_them(key: str, path: str, expected: str,
                                                                     wordpiece: Path, tmp_path: Path) -> None:
    """A one-label head whose config says otherwise (problem_type regression would be "none"): the CrossEncoder's
    activation wins, as CrossEncoder itself applies it."""
    from sentence_transformers import CrossEncoder

    torch.manual_seed(0)
    ckpt = _checkpoint(_tiny(1, None, vocab=500), wordpiece, tmp_path / "ce")
    config = json.loads((ckpt / "config.json").read_text())
    config[key] = {"activation_fn": path} if key == "sentence_transformers" else path
    (ckpt / "config.json").write_text(json.dumps(config))
    loaded = CrossEncoder(str(ckpt), device="cpu")
    name = f"{type(loaded.activation_fn).__module__}.{type(loaded.activation_fn).__name__}"
    assert name == path
    recorded = head_activation(ckpt, config)
    assert recorded["function_to_apply"] == expected and recorded["source"].endswith(
        "sentence_transformers.activation_fn" if key == "sentence_transformers" else key)
    x = np.array([-1.5, 0.2, 3.0])
    np.testing.assert_allclose(apply(x[:, None], expected)[:, 0],
                               loaded.activation_fn(torch.tensor(x, dtype=torch.float64)).numpy(), atol=1e-12)


def test_unservable_activations_are_refused_by_name(wordpiece: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    ckpt = _checkpoint(_tiny(1, None, vocab=500), wordpiece, tmp_path / "tanh")
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config_sentence_transformers.json").write_text(json.dumps(
        {"activation_fn": "torch.nn.modules.activation.Tanh", "model_type": "CrossEncoder"}))
    with pytest.raises(ExportError, match=r"^checkpoint: config_sentence_transformers.json activation_fn "
                                          r"'torch.nn.modules.activation.Tanh' is not served"):
        export_checkpoint(ExportConfig(checkpoint=ckpt, task="classify", repository=tmp_path / "repo", name="t"))
    assert not (tmp_path / "repo" / "t").exists()
    config["sbert_ce_default_activation_function"] = "mypackage.Scaled"
    with pytest.raises(ExportError, match="sbert_ce_default_activation_function 'mypackage.Scaled' is not served"):
        head_activation(tmp_path, config)
    with pytest.raises(ExportError, match="^checkpoint: config.json problem_type 'ordinal' is not one of"):
        head_activation(tmp_path, {**config, "problem_type": "ordinal"})
    with pytest.raises(ValueError, match="single_label_classification"):   # transformers refuses it as well
        transformers.BertConfig(num_labels=1, problem_type="single_label_classification")
    with pytest.raises(ExportError, match="^checkpoint: config.json problem_type 'single_label_classification' needs "
                                          "more than one label"):
        head_activation(tmp_path / "none", {"id2label": {"0": "x"}, "problem_type": "single_label_classification"})
