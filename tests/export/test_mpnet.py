"""MPNet (training/mpnet.py) against `transformers` 5.23, and its export.

References are transformers models from small random configs (tests/mpnet_models.py: 2 layers, 4 heads, a WordPiece
tokenizer in MPNetTokenizer's layout, one text long enough for relative distances past 128) saved with
save_pretrained. Our module equals transformers on a padded batch at every position, writes checkpoints transformers
loads with no missing key; the export's onnxruntime graphs equal transformers (classify, fill-mask, token-classify)
and sentence-transformers' encode (embed, all-mpnet-base-v2's module stack); settings not implemented exactly are
refused by config key.
"""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.mpnet_models import (HF_CLASSES, LABELS, LONG, TAGS, TEXTS, build_checkpoints, hf_feeds, hf_outputs,
                                save_sentence_transformer)

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)
BATCH = TEXTS + [LONG]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_checkpoints(tmp_path_factory.mktemp("mpnet"))


def _masked(texts: list[str]) -> list[str]:
    return [t.replace("the", "<mask>", 1) for t in texts]


def test_the_batch_reaches_every_bucket_and_pads(checkpoints) -> None:
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    feeds = hf_feeds(checkpoints["classify"], BATCH)
    lengths = feeds["attention_mask"].sum(1)
    assert int(lengths.max()) > 129 and int(lengths.min()) < feeds["input_ids"].shape[1]
    n = int(lengths.max())
    distances = torch.arange(n)[None, :] - torch.arange(n)[:, None]
    # 31 of the 32 buckets: the second half's bucket 0 (distance 0 seen from the other side) is never used.
    assert len(MPNetEncoder.relative_position_bucket(distances).unique()) == 31


@pytest.mark.parametrize("task", ["fill-mask", "classify", "token-classify", "embed"])
def test_our_model_equals_transformers_at_every_position(checkpoints, task: str) -> None:
    from training.checkpoint import load_model

    ckpt = checkpoints[task]
    ours, _ = load_model(ckpt)   # transformers' own file; a base MPNetModel loads as the MLM's encoder
    feeds = hf_feeds(ckpt, _masked(BATCH) if task == "fill-mask" else BATCH)
    want = hf_outputs(ckpt, task, feeds)
    def run(f: dict[str, torch.Tensor]) -> torch.Tensor:
        return ours.encode(**f)[0] if task == "embed" else ours(**f)

    with torch.no_grad():
        got = run(feeds)
        other = run({**feeds, "input_ids": feeds["input_ids"].flip(0)})   # other ids: other answers
    assert got.shape == want.shape and torch.isfinite(got).all()
    assert float((got - want).abs().max()) <= 1e-5
    assert float((other - got).abs().max()) > 1e-3


def test_the_relative_position_bias_is_in_the_maths(checkpoints) -> None:
    """A zero bias table changes the real tokens' states, and our bucket index equals transformers' buckets for
    every distance the position table allows."""
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    from training.checkpoint import load_model

    ours, config = load_model(checkpoints["fill-mask"])
    longest = config.max_position_embeddings
    distances = torch.arange(1 - longest, longest)
    assert torch.equal(ours.mpnet.encoder.buckets, MPNetEncoder.relative_position_bucket(distances))
    feeds = hf_feeds(checkpoints["fill-mask"], BATCH)
    real = feeds["attention_mask"].bool()
    with torch.no_grad():
        before = ours.encode(**feeds)[0]
        ours.mpnet.encoder.relative_attention_bias.weight.zero_()
        assert float((ours.encode(**feeds)[0] - before).abs()[real].max()) > 1e-2


@pytest.mark.parametrize("task", ["fill-mask", "classify", "token-classify"])
def test_our_checkpoint_loads_in_transformers(checkpoints, tmp_path: Path, task: str) -> None:
    from tests.family_models import reloaded_by_transformers
    from training.checkpoint import load_model

    ours, _ = load_model(checkpoints[task])
    hf = reloaded_by_transformers(ours, HF_CLASSES[task], tmp_path / task)
    feeds = hf_feeds(checkpoints[task], BATCH)
    with torch.no_grad():
        assert float((hf(**feeds).logits - ours(**feeds)).abs().max()) <= 1e-5


# ----------------------------------------------------------------------------- export


@pytest.fixture(scope="module")
def packages(checkpoints, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict]]:
    from export import ExportConfig, export_checkpoint
    from tests.conftest import one_torch_thread

    repo = tmp_path_factory.mktemp("mpnet-repo")
    reports = {}
    with one_torch_thread():
        for task, variants in (("classify", ("fp32", "int8")), ("fill-mask", ("fp32",)),
                               ("token-classify", ("fp32",))):
            r = export_checkpoint(ExportConfig(checkpoint=checkpoints[task], task=task, repository=repo, name=task,
                                               variants=variants))
            reports[task] = r.parity
    return repo, reports


def _session(path: Path):
    import onnxruntime

    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("task", ["classify", "fill-mask", "token-classify"])
def test_exported_graph_equals_transformers_on_a_padded_batch(packages, checkpoints, task: str) -> None:
    repo, reports = packages
    m = json.loads((repo / task / "1" / "model.json").read_text())
    assert m["architecture"] == "mpnet" and m["max_length"] == 160   # 162 positions past the padding index
    assert [i["name"] for i in m["inputs"]] == ["input_ids", "attention_mask"]   # no token types
    fp32 = reports[task]["variants"]["fp32"]
    assert reports[task]["passed"] and fp32["passed"], fp32
    feeds = hf_feeds(checkpoints[task], _masked(BATCH) if task == "fill-mask" else BATCH)
    want = hf_outputs(checkpoints[task], task, feeds).numpy()
    got = _session(repo / task / "1" / m["variants"]["fp32"]).run(["logits"],
                                                                  {k: v.numpy() for k, v in feeds.items()})[0]
    assert got.shape == want.shape
    assert float(np.abs(got - want).max()) <= 1e-4     # every position, pad rows included
    if task == "fill-mask":
        assert m["mask_token"] == "<mask>" and m["special_tokens"]["pad"] == 1
    if task != "fill-mask":
        assert m["labels"] == (LABELS if task == "classify" else TAGS)


def test_int8_variant_is_gated(packages) -> None:
    """The int8 classifier either passed its agreement gate (then it is in the package) or was refused and left
    out (parity.json says why): never shipped unchecked."""
    repo, reports = packages
    int8 = reports["classify"]["variants"]["int8"]
    manifest = json.loads((repo / "classify" / "1" / "model.json").read_text())
    assert ("int8" in manifest["variants"]) == bool(int8["passed"]), int8
    if not int8["passed"]:
        assert int8["status"].startswith("refused")


def test_validate_reruns_the_gate(packages) -> None:
    from export.validate import validate_package

    repo, _ = packages
    passed, table = validate_package(repo / "token-classify" / "1")
    assert passed, table


def test_embed_equals_sentence_transformers_encode(checkpoints, tmp_path: Path) -> None:
    """all-mpnet-base-v2's shape: an MPNetModel (with its unused pooler) under Pooling(mean) + Normalize, saved by
    sentence-transformers; the package's vectors equal SentenceTransformer.encode on a padded batch with a text
    past distance 128, and its int8 variant, where the gate kept it, agrees by cosine."""
    from sentence_transformers import SentenceTransformer

    from export import ExportConfig, export_checkpoint
    from tests.conftest import one_torch_thread

    st = save_sentence_transformer(checkpoints["embed"], tmp_path / "st")
    with one_torch_thread():
        r = export_checkpoint(ExportConfig(checkpoint=st, task="embed", repository=tmp_path / "repo", name="st",
                                           variants=("fp32", "int8")))
    assert r.parity["passed"] and r.parity["variants"]["fp32"]["reference"] == "sentence-transformers"
    m = json.loads((r.package_dir / "model.json").read_text())
    assert m["embedding"]["modules"] == ["Transformer", "Pooling", "Normalize"]
    assert m["embedding"]["pooling"] == "mean" and m["embedding"]["normalize"] is True
    feeds = {k: v.numpy() for k, v in hf_feeds(st, BATCH).items()}
    got = _session(r.package_dir / "model.onnx").run(["embeddings"], feeds)[0]
    want = SentenceTransformer(str(st), device="cpu").encode(BATCH, convert_to_numpy=True)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert float(np.abs(want[0] - want[1]).max()) > 1e-2
    # int8 is kept only past its cosine gate; then its vectors point where sentence-transformers' do.
    int8 = r.parity["variants"]["int8"]
    assert ("int8" in m["variants"]) == bool(int8["passed"]), int8
    if int8["passed"]:
        quantized = _session(r.package_dir / m["variants"]["int8"]).run(["embeddings"], feeds)[0]
        assert ((quantized * want).sum(1) / np.linalg.norm(quantized, axis=1) >= 0.99).all()


def test_gate_fails_on_a_perturbed_mpnet_graph(checkpoints, tmp_path: Path, monkeypatch) -> None:
    from tests.family_models import assert_gate_refuses_a_perturbed_graph

    assert_gate_refuses_a_perturbed_graph(checkpoints["classify"], "classify", tmp_path / "repo", monkeypatch)


def _refusal(ckpt: Path, task: str, repo: Path, **options) -> str:
    """The export's one-line ExportError for `ckpt`; nothing published."""
    from export import ExportConfig, export_checkpoint
    from export.errors import ExportError

    with pytest.raises(ExportError) as exc:
        export_checkpoint(ExportConfig(checkpoint=ckpt, task=task, repository=repo, name="x", **options))
    assert not (repo / "x").exists() and "\n" not in str(exc.value)
    return str(exc.value)


@pytest.mark.parametrize("changes, named", [
    ({"pad_token_id": 0}, "pad_token_id"),
    ({"relative_attention_num_buckets": 64}, "relative_attention_num_buckets"),
    ({"hidden_act": "quick_gelu"}, "hidden_act"),
    ({"tie_word_embeddings": False}, "tie_word_embeddings"),
])
def test_unsupported_config_is_refused_by_name(checkpoints, tmp_path: Path, changes: dict, named: str) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoints["fill-mask"], ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, **changes}))
    assert named + ":" in _refusal(ckpt, "fill-mask", tmp_path / "r")


def test_optimized_variant_and_missing_heads_are_refused_by_name(checkpoints, tmp_path: Path) -> None:
    message = _refusal(checkpoints["classify"], "classify", tmp_path, variants=("fp32", "optimized"))
    assert message.startswith("--variants optimized: MPNet's relative-position bias"), message
    assert "needs MPNetForSequenceClassification" in _refusal(checkpoints["embed"], "classify", tmp_path)
