"""The int8 variant of an embedding package (`--task embed --variants fp32,int8`): built by export/int8.py's rewrite,
judged by its smallest cosine to sentence-transformers' own vectors, the CPU default when it passes (the encoders'
rule), refused alone when it does not. `optimized` (onnxruntime's fused attention) for the families it fuses,
judged elementwise at the optimized tolerance; refused by name for ModernBERT. Models: a sentence-transformers 6
model (Transformer + mean Pooling + Dense + Normalize) over the tiny random BERT, and one over a small random XLM-R
(tests/xlmr_models.py), built here.
"""
from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from export import ExportConfig, ExportError, export_checkpoint
from export.config import Tolerances
from tests.st_models import save_st

st = pytest.importorskip("sentence_transformers")
logging.getLogger("sentence_transformers").setLevel(logging.ERROR)
logging.getLogger("transformers").setLevel(logging.ERROR)

TEXTS = ["A man is eating food.", "Now is the winter of our discontent made glorious summer by this sun of York",
         "To be", "the king sat on his throne in the old castle", "Where the bee sucks, there suck I",
         "Friends, Romans, countrymen, lend me your ears; I come to bury Caesar, not to praise him."]


@pytest.fixture(scope="module")
def st_bert(tiny_checkpoints, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_st(tiny_checkpoints.mlm, tmp_path_factory.mktemp("st") / "st-bert", "mean")


def export(checkpoint: Path, repo: Path, variants: tuple[str, ...] = ("fp32", "int8"), **tolerances) -> Path:
    from tests.conftest import one_torch_thread

    cfg = ExportConfig(checkpoint=checkpoint, task="embed", repository=repo, name="st", variants=variants,
                       tolerances=replace(Tolerances(), **tolerances))
    with one_torch_thread():
        return export_checkpoint(cfg).package_dir


def vectors(package: Path, variant: str, texts: list[str]) -> np.ndarray:
    """The variant's graph on a right-padded batch of the package's own tokenizer ids (what the server feeds)."""
    manifest = json.loads((package / "model.json").read_text())
    tok = Tokenizer.from_file(str(package / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    enc = [tok.encode(t).ids for t in texts]
    width = max(map(len, enc))
    ids = np.full((len(texts), width), manifest["special_tokens"]["pad"], dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, row in enumerate(enc):
        ids[i, :len(row)], mask[i, :len(row)] = row, 1
    names = {t["name"] for t in manifest["inputs"]}
    feeds = {k: v for k, v in {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}.items()
             if k in names}
    session = ort.InferenceSession(str(package / manifest["variants"][variant]), providers=["CPUExecutionProvider"])
    return session.run(["embeddings"], feeds)[0]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def assert_int8_package(package: Path, checkpoint: Path, optimized: bool = False) -> None:
    manifest = json.loads((package / "model.json").read_text())
    assert manifest["variants"] == {"fp32": "model.onnx", "int8": "model.int8.onnx",
                                    **({"optimized": "model.optimized.onnx"} if optimized else {})}
    assert manifest["default_variant"] == {"cpu": "int8", "cuda": "optimized" if optimized else "fp32"}
    graph = onnx.load(str(package / "model.int8.onnx"))
    assert any(n.op_type == "MatMulIntegerToFloat" for n in graph.graph.node)
    parity = json.loads((package / "parity.json").read_text())["variants"]["int8"]
    assert parity["passed"] is True and parity["reference"] == "sentence-transformers"
    assert "batch8_padded" in parity["max_abs_diff"]          # judged on every held-out text, not fp32's twelve

    ref = st.SentenceTransformer(str(checkpoint), device="cpu").encode(TEXTS, batch_size=len(TEXTS))
    got = vectors(package, "int8", TEXTS)
    assert got.shape == ref.shape
    assert cosines(got, ref).min() >= 0.99
    assert parity["min_cosine"] >= 0.99
    assert np.abs(got - ref).max() > 1e-6           # a quantized graph, not the fp32 one under another name


def test_int8_embedding_passes_the_gate_and_is_the_cpu_default(st_bert: Path, tmp_path: Path) -> None:
    package = export(st_bert, tmp_path)
    assert_int8_package(package, st_bert)

    from export.validate import validate_package

    passed, table = validate_package(package)     # `python -m export validate`: both variants again
    assert passed and "int8       min cosine" in table and "(>= 0.99," in table, table


def test_int8_and_optimized_embedding_over_xlm_roberta(tmp_path: Path) -> None:
    """The newer families take the same variants: a sentence-transformers model over a random XLM-R, whose fused
    graph (Attention per layer) equals sentence-transformers' vectors elementwise."""
    import torch
    import transformers
    from sentence_transformers.sentence_transformer import modules

    from tests.xlmr_models import hf_config, unigram_tokenizer

    tokenizer = unigram_tokenizer(tmp_path / "tok")
    base = tmp_path / "xlmr"
    torch.manual_seed(0)
    transformers.XLMRobertaModel(hf_config(len(tokenizer))).eval().save_pretrained(base)
    tokenizer.save_pretrained(base)
    transformer = modules.Transformer(str(base))
    st.SentenceTransformer(modules=[transformer, modules.Pooling(transformer.get_embedding_dimension(), "mean"),
                                    modules.Normalize()], device="cpu").save(str(tmp_path / "st"))
    package = export(tmp_path / "st", tmp_path / "repo", variants=("fp32", "optimized", "int8"))
    assert_int8_package(package, tmp_path / "st", optimized=True)
    parity = json.loads((package / "parity.json").read_text())["variants"]["optimized"]
    assert parity["passed"] is True and parity["fused_operators"]["Attention"] == 2
    graph = onnx.load(str(package / "model.optimized.onnx"))
    assert sum(n.op_type == "Attention" for n in graph.graph.node) == 2
    ref = st.SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(TEXTS, batch_size=len(TEXTS))
    np.testing.assert_allclose(vectors(package, "optimized", TEXTS), ref, atol=5e-4)


def test_an_int8_below_the_cosine_limit_is_refused_alone(st_bert: Path, tmp_path: Path, caplog) -> None:
    """A limit no int8 graph reaches: the package ships fp32 alone, fp32 the CPU default, the refusal and its
    figure in parity.json and the log."""
    with caplog.at_level(logging.WARNING, logger="export.embed"):
        package = export(st_bert, tmp_path, int8_min_cosine=1.0)
    manifest = json.loads((package / "model.json").read_text())
    assert manifest["variants"] == {"fp32": "model.onnx"}
    assert manifest["default_variant"]["cpu"] == "fp32"
    assert not (package / "model.int8.onnx").exists()
    parity = json.loads((package / "parity.json").read_text())
    assert parity["passed"] is True and parity["variants"]["int8"]["passed"] is False
    assert parity["variants"]["int8"]["status"].startswith("refused: cosine 0.9")
    assert "refused int8" in caplog.text


def test_fp32_only_by_default_and_other_variants_refused_by_name(st_bert: Path, tmp_path: Path) -> None:
    package = export(st_bert, tmp_path / "a", variants=("fp32",))
    manifest = json.loads((package / "model.json").read_text())
    assert manifest["variants"] == {"fp32": "model.onnx"} and manifest["default_variant"]["cpu"] == "fp32"
    with pytest.raises(ExportError, match="--variants: an embedding package ships fp32 and optionally optimized and "
                                          "int8, got fp32,fp16"):
        export(st_bert, tmp_path / "b", variants=("fp32", "fp16"))
    assert not (tmp_path / "b" / "st").exists()


def test_optimized_embedding_refused_by_name_for_modernbert(tiny_checkpoints, tmp_path: Path) -> None:
    import shutil

    import transformers

    (tmp_path / "mb").mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(tiny_checkpoints.mlm / name, tmp_path / "mb" / name)
    vocab = Tokenizer.from_file(str(tmp_path / "mb" / "tokenizer.json")).get_vocab_size()
    config = transformers.ModernBertConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                           num_attention_heads=2, pad_token_id=0, bos_token_id=1, cls_token_id=1,
                                           eos_token_id=2, sep_token_id=2)
    transformers.ModernBertModel(config).save_pretrained(tmp_path / "mb")
    with pytest.raises(ExportError, match="--variants: optimized: ModernBERT's rotary attention"):
        export(tmp_path / "mb", tmp_path / "repo", variants=("fp32", "optimized"))
