"""ModernBERT (training/modernbert.py) against `transformers` 5.23, and its export.

References are transformers models from small random configs (tests/modernbert_models.py: 4 layers alternating
global and local attention, a window of 8 tokens, texts longer than it) saved with save_pretrained. Our module equals
transformers on a padded batch at EVERY position (pad rows too: the gate compares them), loads the config keys of
the released checkpoints as transformers does, writes checkpoints transformers loads with no missing key; the
export's onnxruntime graph equals transformers on the padded batch, its int8 variant agrees where the gate kept it;
unsupported config options are refused by name.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.modernbert_models import (HF_CLASSES, LABELS, TAGS, TEXTS, WINDOW, build_checkpoints, hf_logits,
                                     padded_batch, st_embeddings)

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_checkpoints(tmp_path_factory.mktemp("modernbert"))


def test_the_test_batch_exercises_the_window_and_padding(checkpoints) -> None:
    feeds = padded_batch(checkpoints["classify"], TEXTS)
    lengths = feeds["attention_mask"].sum(1)
    assert int(lengths.max()) > 2 * WINDOW
    assert feeds["input_ids"].shape[1] - int(lengths.min()) > WINDOW // 2   # pad rows that see no key locally
    cfg = json.loads((checkpoints["classify"] / "config.json").read_text())
    assert cfg["layer_types"] == ["full_attention", "sliding_attention"] * 2


@pytest.mark.parametrize("task", ["fill-mask", "classify", "classify-mean", "token-classify"])
def test_our_model_equals_transformers_at_every_position(checkpoints, task: str) -> None:
    from training.checkpoint import load_model

    ckpt = checkpoints[task]
    ours, _ = load_model(ckpt)   # transformers' own file, loaded strictly
    feeds = padded_batch(ckpt, TEXTS, "winter" if task == "fill-mask" else None)
    want = hf_logits(ckpt, task, feeds)
    with torch.no_grad():
        got = ours(**feeds)
    assert torch.isfinite(got).all()
    assert float((got - want).abs().max()) <= 1e-5
    # The comparison is not between constants: other ids give other logits.
    with torch.no_grad():
        other = ours(**{**feeds, "input_ids": feeds["input_ids"].flip(0)})
    assert float((other - got).abs().max()) > 1e-3


def test_encoder_equals_transformers_and_the_window_matters(checkpoints) -> None:
    from training.checkpoint import load_model

    ckpt = checkpoints["fill-mask"]
    ours, config = load_model(ckpt)
    feeds = padded_batch(ckpt, TEXTS)
    base = transformers.ModernBertModel.from_pretrained(ckpt).eval()
    with torch.no_grad():
        want = base(**feeds).last_hidden_state
        got = ours.encode(**feeds)
        assert float((got - want).abs().max()) <= 1e-5
        # Seen through a window wider than the text, the real tokens' states change: the window is in the maths.
        config.local_attention = 128
        wide = type(ours)(config).eval()
        wide.load_state_dict(ours.state_dict())
        real = feeds["attention_mask"].bool()
        assert float((wide.encode(**feeds) - got).abs()[real].max()) > 1e-2


def test_released_config_keys_load_as_transformers_reads_them(checkpoints, tmp_path: Path) -> None:
    """ModernBERT-base's config.json has no layer_types / rope_parameters: global_attn_every_n_layers and the two
    thetas instead. Both readers must build the same model from it."""
    import shutil

    from training.checkpoint import load_model

    d = tmp_path / "released"
    shutil.copytree(checkpoints["classify"], d)
    cfg = json.loads((d / "config.json").read_text())
    rope = cfg.pop("rope_parameters")
    cfg.pop("layer_types")
    cfg.update(global_attn_every_n_layers=3, global_rope_theta=rope["full_attention"]["rope_theta"],
               local_rope_theta=rope["sliding_attention"]["rope_theta"])
    (d / "config.json").write_text(json.dumps(cfg))
    ours, config = load_model(d)
    assert config.layer_types == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    assert (config.global_rope_theta, config.local_rope_theta) == (1000.0, 100.0)
    feeds = padded_batch(d, TEXTS)
    with torch.no_grad():
        assert float((ours(**feeds) - hf_logits(d, "classify", feeds)).abs().max()) <= 1e-5


def test_a_file_with_the_tied_decoder_copy_loads(checkpoints, tmp_path: Path) -> None:
    """transformers 5 leaves decoder.weight out when tied; files that carry the copy load to the same model."""
    import shutil

    from safetensors.torch import load_file, save_file

    from training.checkpoint import load_model

    d = tmp_path / "with-copy"
    shutil.copytree(checkpoints["fill-mask"], d)
    weights = load_file(str(d / "model.safetensors"))
    assert "decoder.weight" not in weights
    weights["decoder.weight"] = weights["model.embeddings.tok_embeddings.weight"].clone()
    save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt"})
    ours, _ = load_model(d)
    assert ours.decoder.weight is ours.model.embeddings.tok_embeddings.weight
    feeds = padded_batch(d, TEXTS)
    with torch.no_grad():
        assert float((ours(**feeds) - hf_logits(d, "fill-mask", feeds)).abs().max()) <= 1e-5


@pytest.mark.parametrize("task", ["fill-mask", "classify-mean", "token-classify"])
def test_our_checkpoint_loads_in_transformers(checkpoints, tmp_path: Path, task: str) -> None:
    from tests.family_models import reloaded_by_transformers
    from training.checkpoint import load_model

    ours, config = load_model(checkpoints[task])
    if task == "fill-mask":   # an untied decoder is its own weight, written and read back
        config.tie_word_embeddings = False
        untied = type(ours)(config)
        untied.load_state_dict(ours.state_dict())
        ours = untied
    hf = reloaded_by_transformers(ours, HF_CLASSES[task], tmp_path / task)
    feeds = padded_batch(checkpoints[task], TEXTS)
    with torch.no_grad():
        assert float((hf(**feeds).logits - ours(**feeds)).abs().max()) <= 1e-5
    if task == "fill-mask":
        assert not torch.equal(hf.decoder.weight, hf.model.embeddings.tok_embeddings.weight)


# ----------------------------------------------------------------------------- export


def _trained_classifier(src: Path, out: Path) -> Path:
    """The random classifier after a few steps on the synthetic keyword task (tests/conftest.py), saved by us: a
    random head's near ties make top-1 agreement meaningless, a trained one's margins do not."""
    from tokenizers import Tokenizer

    from tests.conftest import TINY_LABELS, _train_classifier, synthetic_examples
    from training.checkpoint import load_model, save_model

    model, _ = load_model(src, id2label=dict(enumerate(TINY_LABELS)))
    _train_classifier(model, Tokenizer.from_file(str(src / "tokenizer.json")))
    files = {f.name: f for f in src.iterdir() if f.name.startswith(("tokenizer", "special_tokens"))}
    (out / "eval.jsonl").write_text("".join(json.dumps({"text": t, "label": TINY_LABELS[y]}) + "\n"
                                            for t, y in synthetic_examples(96, seed=3)))
    return save_model(model, out / "classify-trained", tokenizer_files=files)


@pytest.fixture(scope="module")
def packages(checkpoints, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict]]:
    from tests.conftest import one_torch_thread
    from export import ExportConfig, export_checkpoint

    repo = tmp_path_factory.mktemp("modernbert-repo")
    plan = {"classify": ("classify", ("fp32",)), "fill-mask": ("fill-mask", ("fp32", "int8")),
            "token-classify": ("token-classify", ("fp32",)), "classify-mean": ("classify", ("fp32",)),
            "classify-trained": ("classify", ("fp32", "int8"))}
    reports = {}
    with one_torch_thread():
        sources = {**checkpoints, "classify-trained": _trained_classifier(checkpoints["classify"],
                                                                          tmp_path_factory.mktemp("trained"))}
        for name, (task, variants) in plan.items():
            labelled = sources[name].parent / "eval.jsonl" if name == "classify-trained" else None
            r = export_checkpoint(ExportConfig(checkpoint=sources[name], task=task, repository=repo, name=name,
                                               variants=variants, eval_data=labelled))
            reports[name] = r.parity
    return repo, reports


def _session(path: Path):
    import onnxruntime

    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("name", ["classify", "classify-mean", "fill-mask", "token-classify"])
def test_exported_graph_equals_transformers_on_a_padded_batch(packages, checkpoints, name: str) -> None:
    repo, reports = packages
    m = json.loads((repo / name / "1" / "model.json").read_text())
    assert m["architecture"] == "modernbert"
    assert [i["name"] for i in m["inputs"]] == ["input_ids", "attention_mask"]   # no token types
    fp32 = reports[name]["variants"]["fp32"]
    assert reports[name]["passed"] and fp32["passed"] and max(fp32["max_abs_diff"].values()) < 1e-4
    task = "fill-mask" if name == "fill-mask" else name
    feeds = padded_batch(checkpoints[name], TEXTS, "winter" if name == "fill-mask" else None)
    want = hf_logits(checkpoints[name], task, feeds).numpy()
    got = _session(repo / name / "1" / m["variants"]["fp32"]).run(["logits"], {k: v.numpy() for k, v in feeds.items()})[0]
    assert got.shape == want.shape
    assert float(np.abs(got - want).max()) <= 1e-4     # every position, pad rows included
    if name == "fill-mask":
        assert m["mask_token"] == "[MASK]"


def test_validate_reruns_the_gate(packages) -> None:
    from export.validate import validate_package

    repo, _ = packages
    passed, table = validate_package(repo / "token-classify" / "1")
    assert passed, table


def test_int8_variant_agrees_where_the_gate_kept_it(packages, tmp_path: Path) -> None:
    """The trained classifier: int8 passed its top-1 agreement gate and is the CPU default; its answers agree with
    transformers on our checkpoint. The random MLM's near-tied logits may not keep 99% of their top-1: then the gate
    refuses that int8 and the package ships without it (parity.json says why)."""
    repo, reports = packages
    m = json.loads((repo / "classify-trained" / "1" / "model.json").read_text())
    int8 = reports["classify-trained"]["variants"]["int8"]
    assert int8["passed"] and m["default_variant"]["cpu"] == "int8", int8
    ckpt = Path(m["source"]["checkpoint"])
    feeds = padded_batch(ckpt, TEXTS)
    want = hf_logits(ckpt, "classify", feeds).numpy()
    got = _session(repo / "classify-trained" / "1" / m["variants"]["int8"]).run(
        ["logits"], {k: v.numpy() for k, v in feeds.items()})[0]
    assert (got.argmax(-1) == want.argmax(-1)).all()
    assert float(np.abs(got - want).max()) < 0.5
    mlm = reports["fill-mask"]["variants"]["int8"]
    manifest = json.loads((repo / "fill-mask" / "1" / "model.json").read_text())
    if mlm["passed"]:
        assert "int8" in manifest["variants"]
    else:
        assert mlm["status"].startswith("refused: top-1 agreement") and "int8" not in manifest["variants"]
        assert not (repo / "fill-mask" / "1" / "model.int8.onnx").exists()


def test_embed_export_equals_sentence_transformers(checkpoints, tmp_path: Path) -> None:
    """A ModernBertModel checkpoint (gte-modernbert's shape) as an embedding package, CLS-pooled and normalized as
    gte-modernbert is, and mean-pooled as nomic's: equal to sentence-transformers on the same directory."""
    from tests.conftest import one_torch_thread
    from export import ExportConfig, export_checkpoint

    ckpt = checkpoints["embed"]
    feeds = {k: v.numpy() for k, v in padded_batch(ckpt, TEXTS).items()}
    for pooling, normalize in (("cls", "on"), ("mean", "off")):
        with one_torch_thread():
            r = export_checkpoint(ExportConfig(checkpoint=ckpt, task="embed", repository=tmp_path, name=pooling,
                                               pooling=pooling, normalize=normalize))
        assert r.parity["passed"]
        got = _session(r.package_dir / "model.onnx").run(["embeddings"], feeds)[0]
        want = st_embeddings(ckpt, pooling, normalize == "on", TEXTS)
        assert float(np.abs(got - want).max()) <= 1e-4


def test_gate_fails_on_a_perturbed_modernbert_graph(checkpoints, tmp_path: Path, monkeypatch) -> None:
    from tests.family_models import assert_gate_refuses_a_perturbed_graph

    assert_gate_refuses_a_perturbed_graph(checkpoints["classify"], "classify", tmp_path / "repo", monkeypatch)


def _with_config(src: Path, dest: Path, **changes) -> Path:
    import shutil

    shutil.copytree(src, dest)
    cfg = json.loads((dest / "config.json").read_text())
    for key, value in changes.items():
        if "." in key:
            outer, inner = key.split(".", 1)
            cfg[outer][inner] = value
        else:
            cfg[key] = value
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


@pytest.mark.parametrize("changes, named", [
    ({"rope_parameters.full_attention": {"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0}},
     "rope_parameters.full_attention.rope_type"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling"),
    ({"classifier_pooling": "max"}, "classifier_pooling"),
    ({"hidden_activation": "quick_gelu"}, "hidden_activation"),
    ({"layer_types": ["full_attention", "chunked_attention", "full_attention", "sliding_attention"]}, "layer_types"),
])
def test_unsupported_config_is_refused_by_name(checkpoints, tmp_path: Path, changes: dict, named: str) -> None:
    from export import ExportConfig, export_checkpoint
    from export.errors import ExportError

    ckpt = _with_config(checkpoints["classify"], tmp_path / "ckpt", **changes)
    with pytest.raises(ExportError) as exc:
        export_checkpoint(ExportConfig(checkpoint=ckpt, task="classify", repository=tmp_path / "r", name="x"))
    message = str(exc.value)
    assert named + ":" in message and "\n" not in message, message
    assert not (tmp_path / "r" / "x").exists()


def test_optimized_variant_is_refused_by_name(checkpoints, tmp_path: Path) -> None:
    from export import ExportConfig, export_checkpoint
    from export.errors import ExportError

    with pytest.raises(ExportError, match=r"^--variants: optimized: ModernBERT's rotary attention"):
        export_checkpoint(ExportConfig(checkpoint=checkpoints["classify"], task="classify", repository=tmp_path,
                                       name="x", variants=("fp32", "optimized")))


def test_labels_and_tasks_follow_the_head(packages, checkpoints, tmp_path: Path) -> None:
    """The manifest's labels are the checkpoint's; a head the task does not have is refused naming ModernBERT's."""
    from export import ExportConfig, export_checkpoint
    from export.errors import ExportError

    repo, _ = packages
    for name, labels in (("classify", LABELS), ("token-classify", TAGS)):
        assert json.loads((repo / name / "1" / "model.json").read_text())["labels"] == labels
    with pytest.raises(ExportError, match="needs ModernBertForSequenceClassification"):
        export_checkpoint(ExportConfig(checkpoint=checkpoints["fill-mask"], task="classify", repository=tmp_path,
                                       name="x"))
