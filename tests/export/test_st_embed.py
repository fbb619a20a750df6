"""sentence-transformers models as versions 2 to 6 save them, exported with `--task embed` and compared with
`SentenceTransformer.encode` itself (never with our own pooling): every pooling mode, Dense (tanh) and Normalize in
order, prompts (named and default) on a padded batch, the v2-5 pooling layout read the same as v6's, and what the
export refuses by name (another module type, include_prompt false with prompts, an unknown activation). Models are
built here over the tiny random BERT (hidden 64) with sentence-transformers' own modules and saved with
`SentenceTransformer.save`.
"""
from __future__ import annotations

import json
import logging
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from tokenizers import Tokenizer

from export import ExportConfig, ExportError, ParityFailure, export_checkpoint
from tests.st_models import PROMPTS, save_st

st = pytest.importorskip("sentence_transformers")
logging.getLogger("sentence_transformers").setLevel(logging.ERROR)
logging.getLogger("transformers").setLevel(logging.ERROR)

TEXTS = ["A man is eating food.", "Now is the winter of our discontent made glorious summer by this sun of York",
         "To be", "the king sat on his throne in the old castle"]   # different lengths: one padded batch


@pytest.fixture(scope="module")
def st6(tiny_checkpoints, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Transformer + Pooling(mean) + Dense(64 -> 32, tanh) + Normalize, two prompts, "query" the default."""
    return save_st(tiny_checkpoints.mlm, tmp_path_factory.mktemp("st") / "st6", "mean", prompts=PROMPTS,
                   default_prompt_name="query")


def export(checkpoint: Path, repo: Path, name: str = "st") -> Path:
    from tests.conftest import one_torch_thread

    with one_torch_thread():
        return export_checkpoint(ExportConfig(checkpoint=checkpoint, task="embed", repository=repo,
                                              name=name)).package_dir


def served(package: Path, texts: list[str], prefix: str = "") -> np.ndarray:
    """The package's graph on a right-padded batch of its own tokenizer's ids (what the server feeds)."""
    manifest = json.loads((package / "model.json").read_text())
    tok = Tokenizer.from_file(str(package / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    encodings = [tok.encode(prefix + t) for t in texts]
    width = max(len(e.ids) for e in encodings)
    ids = np.full((len(texts), width), manifest["special_tokens"]["pad"], dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, e in enumerate(encodings):
        ids[i, :len(e.ids)], mask[i, :len(e.ids)] = e.ids, 1
    feeds = {"input_ids": ids, "attention_mask": mask}
    if any(t["name"] == "token_type_ids" for t in manifest["inputs"]):
        feeds["token_type_ids"] = np.zeros_like(ids)
    session = ort.InferenceSession(str(package / manifest["variants"]["fp32"]), providers=["CPUExecutionProvider"])
    return session.run(["embeddings"], feeds)[0]


def assert_same(got: np.ndarray, ref: np.ndarray) -> None:
    assert got.shape == ref.shape
    cosine = (got * ref).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
    assert (cosine >= 0.9999).all(), cosine
    np.testing.assert_allclose(got, ref, atol=1e-4)


def test_st6_dense_normalize_and_prompts_equal_sentence_transformers(st6: Path, tmp_path: Path) -> None:
    package = export(st6, tmp_path)
    manifest = json.loads((package / "model.json").read_text())
    embedding = manifest["embedding"]
    assert embedding["dimension"] == 32 and manifest["outputs"][0]["shape"] == ["batch", 32]
    assert embedding["modules"] == ["Transformer", "Pooling", "Dense", "Normalize"]
    assert embedding["pooling"] == "mean" and embedding["normalize"] is True
    assert embedding["prompts"]["query"] == "query: " and embedding["default_prompt_name"] == "query"
    parity = json.loads((package / "parity.json").read_text())["variants"]["fp32"]
    assert parity["reference"] == "sentence-transformers"
    assert {"batch1", "batch3_padded", "prompt_query", "prompt_passage"} <= set(parity["max_abs_diff"])

    model = st.SentenceTransformer(str(st6), device="cpu")
    default = model.encode(TEXTS, batch_size=len(TEXTS))                      # the default prompt applies
    assert_same(served(package, TEXTS, "query: "), default)
    named = model.encode(TEXTS, prompt_name="passage", batch_size=len(TEXTS))
    assert_same(served(package, TEXTS, "passage of text: "), named)
    assert not np.allclose(default, named, atol=1e-3)                         # the prompt is in the vectors
    np.testing.assert_allclose(np.linalg.norm(default, axis=1), 1.0, atol=1e-5)

    from export.validate import validate_package

    passed, table = validate_package(package)                  # `python -m export validate`: the same gate again
    assert passed and "prompt_passage" in table and "against sentence-transformers" in table, table


@pytest.mark.parametrize("modes", [("mean", "max", "cls"), ("mean_sqrt_len_tokens", "weightedmean", "lasttoken")])
def test_each_pooling_mode_equals_sentence_transformers(tiny_checkpoints, tmp_path: Path, modes) -> None:
    """Three modes concatenated per model (so each mode's 64 values are compared on their own), no Dense, not
    normalized: the pooled vectors straight out of the graph."""
    checkpoint = save_st(tiny_checkpoints.mlm, tmp_path / "st", list(modes), dense=False, normalize=False)
    assert json.loads((checkpoint / "1_Pooling" / "config.json").read_text())["pooling_mode"] == list(modes)
    package = export(checkpoint, tmp_path / "repo")
    ref = st.SentenceTransformer(str(checkpoint), device="cpu").encode(TEXTS, batch_size=len(TEXTS))
    got = served(package, TEXTS)
    assert got.shape == (len(TEXTS), 3 * 64)
    for i, mode in enumerate(modes):
        assert_same(got[:, i * 64:(i + 1) * 64], ref[:, i * 64:(i + 1) * 64])
    assert json.loads((package / "model.json").read_text())["embedding"]["pooling"] == "+".join(modes)


def test_old_layout_is_read_the_same(st6: Path, tmp_path: Path) -> None:
    """v2-5 keys (`pooling_mode_mean_tokens`, `word_embedding_dimension`) and a pytorch_model.bin Dense read as the
    v6 save does; sentence-transformers itself encodes both alike."""
    from export.st_modules import read_pooling_config, read_st_modules

    old = tmp_path / "old"
    shutil.copytree(st6, old)
    (old / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 64, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}))
    from safetensors.torch import load_file

    dense = old / "2_Dense"
    torch.save(load_file(str(dense / "model.safetensors")), dense / "pytorch_model.bin")
    (dense / "model.safetensors").unlink()
    (dense / "config.json").write_text(json.dumps({"in_features": 64, "out_features": 32, "bias": True,
                                                   "activation_function": "torch.nn.modules.activation.Tanh"}))
    new_modules, old_modules = read_st_modules(st6, 64), read_st_modules(old, 64)
    assert old_modules.pooling_modes == new_modules.pooling_modes == ("mean",)
    assert [type(s).__name__ for s in old_modules.steps] == ["DenseLayer", "str"] and old_modules.normalize
    assert torch.equal(old_modules.steps[0].weight, new_modules.steps[0].weight)
    assert old_modules.prompts == new_modules.prompts and old_modules.default_prompt_name == "query"
    a = st.SentenceTransformer(str(st6), device="cpu").encode(TEXTS[:2])
    b = st.SentenceTransformer(str(old), device="cpu").encode(TEXTS[:2])
    np.testing.assert_allclose(a, b, atol=1e-6)
    legacy_max = {"word_embedding_dimension": 64, "pooling_mode_max_tokens": True, "pooling_mode_mean_tokens": True,
                  "pooling_mode_lasttoken": True}
    assert read_pooling_config(legacy_max, old, 64) == (("max", "mean", "lasttoken"), True)  # its concat order
    assert read_pooling_config({"pooling_mode_cls_token": False}, old, 64) == (("mean",), True)  # none set: mean


def _edited(st6: Path, tmp_path: Path, change) -> Path:
    copy = tmp_path / "edited"
    shutil.copytree(st6, copy)
    change(copy)
    return copy


def _add_module(copy: Path, type_name: str, path: str) -> None:
    modules = json.loads((copy / "modules.json").read_text())
    modules.insert(3, {"idx": 3, "name": "3", "path": path, "type": type_name})
    (copy / "modules.json").write_text(json.dumps(modules))


def _edit_json(file: Path, **values) -> None:
    file.write_text(json.dumps({**json.loads(file.read_text()), **values}))


@pytest.mark.parametrize("change, named", [
    (lambda c: _add_module(c, "sentence_transformers.models.LayerNorm", "3_LayerNorm"),
     "module type sentence_transformers.models.LayerNorm at path '3_LayerNorm'"),
    (lambda c: _add_module(c, "my_package.Projection", "3_Projection"), "module type my_package.Projection"),
    (lambda c: _edit_json(c / "1_Pooling" / "config.json", include_prompt=False), "include_prompt: false"),
    (lambda c: _edit_json(c / "1_Pooling" / "config.json", pooling_mode="median"), "pooling_mode 'median'"),
    (lambda c: _edit_json(c / "2_Dense" / "config.json", activation_function="my.Swish"),
     "activation_function 'my.Swish'"),
    (lambda c: _edit_json(c / "config_sentence_transformers.json", default_prompt_name="nope"),
     "default_prompt_name 'nope'"),
], ids=["st-module", "foreign-module", "include-prompt", "pooling-mode", "activation", "default-prompt"])
def test_refused_by_name(st6: Path, tmp_path: Path, change, named: str) -> None:
    with pytest.raises(ExportError) as caught:
        export(_edited(st6, tmp_path, change), tmp_path / "repo")
    assert named in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "repo" / "st").exists()


def test_the_gate_fails_a_graph_that_misses_a_module(st6: Path, tmp_path: Path) -> None:
    """A builder whose graph leaves Dense out: sentence-transformers' own vectors refuse it."""
    from export import skeleton
    from export.embed import EmbedBuilder

    builder = EmbedBuilder(ExportConfig(checkpoint=st6, task="embed", repository=tmp_path, name="nodense"))
    modules = builder.pooling.modules
    builder.pooling = replace(builder.pooling, modules=replace(modules, steps=("normalize",)))
    with pytest.raises(ParityFailure) as caught:
        skeleton.run(builder.cfg, builder)
    assert "graph answers [1, 64], sentence-transformers [1, 32]" in str(caught.value)
    assert not (tmp_path / "nodense").exists()


def test_without_sentence_transformers_the_gate_falls_back_and_says_so(st6: Path, tmp_path: Path, monkeypatch,
                                                                      caplog) -> None:
    """The library absent (its import fails): the gate compares with the PyTorch encoder and our head, logged,
    and parity.json names that reference."""
    import sys

    monkeypatch.setitem(sys.modules, "sentence_transformers", None)   # `import sentence_transformers` fails
    with caplog.at_level(logging.WARNING, logger="export.embed_gate"):
        package = export(st6, tmp_path)
    assert "sentence-transformers is not installed" in caplog.text
    assert json.loads((package / "parity.json").read_text())["variants"]["fp32"]["reference"] == "torch"


def test_version_6_length_is_the_tokenizers_and_long_texts_are_cut_as_sentence_transformers_cuts(
        st6: Path, tmp_path: Path) -> None:
    """sentence-transformers 6 keeps max_seq_length on the tokenizer (model_max_length): the package's max_length;
    the gate's texts longer than it are cut as the library (and the server's truncate) cut them."""
    short = _edited(st6, tmp_path, lambda c: _edit_json(c / "tokenizer_config.json", model_max_length=12))
    package = export(short, tmp_path / "repo")
    assert json.loads((package / "model.json").read_text())["max_length"] == 12
    model = st.SentenceTransformer(str(short), device="cpu")
    assert model.max_seq_length == 12
    tok = Tokenizer.from_file(str(package / "tokenizer.json"))
    from export.heldout import BUILTIN_TEXTS

    assert sum(len(tok.encode(t).ids) > 12 for t in list(BUILTIN_TEXTS)[:12]) >= 6   # the gate cut most texts


@pytest.mark.parametrize("family", ["roberta", "distilbert", "albert", "electra"])
def test_a_family_base_model_embeds_as_sentence_transformers(family: str, tmp_path: Path) -> None:
    """RobertaModel / DistilBertModel / AlbertModel / ElectraModel under Pooling(mean) + Normalize (the shape of
    all-distilroberta-v1, msmarco-distilbert-*, multi-qa-distilbert-cos-v1): the package's vectors equal
    SentenceTransformer.encode on a padded batch."""
    from tests.conftest import family_tokenizers
    from tests.family_models import BASE_CLASSES, base_checkpoint

    base = base_checkpoint(family, family_tokenizers(tmp_path), tmp_path / "base")
    assert json.loads((base / "config.json").read_text())["architectures"] == [BASE_CLASSES[family]]
    checkpoint = save_st(base, tmp_path / "st", "mean", dense=False)
    package = export(checkpoint, tmp_path / "repo")
    manifest = json.loads((package / "model.json").read_text())
    assert manifest["embedding"]["modules"] == ["Transformer", "Pooling", "Normalize"]
    ref = st.SentenceTransformer(str(checkpoint), device="cpu").encode(TEXTS, batch_size=len(TEXTS))
    assert_same(served(package, TEXTS), ref)
    assert float(np.abs(ref[0] - ref[1]).max()) > 1e-2
