"""DeBERTa-v2 / v3 (training/deberta_v2.py) against `transformers`, through the export and onnxruntime.

References are transformers models built from small random configs (tests/deberta_models.py) and saved with
save_pretrained, i.e. what a user brings, in two shapes: v3 (relative positions only, 8 log buckets, shared keys,
LayerNormed distance table, no token types) and v2 (absolute positions, token types, separate c2p / p2c
projections, plain clipped distances, the conv layer). Test sentences run 30-60 tokens, far past the buckets' exact
range and the trace's length of 5, so the bucket tables and the run-time gathers are both exercised.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.deberta_models import LABELS, MAX_POSITIONS, V2_SHAPE, pair_feeds, save_checkpoint, unigram_tokenizer

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)

SHAPES: dict[str, dict[str, Any]] = {"v3": {}, "v2": V2_SHAPE, "c2p": {"pos_att_type": ["c2p"], "share_att_key": False},
                                     "absolute": {"relative_attention": False, "position_biased_input": True}}
HEADS = {"classify": "DebertaV2ForSequenceClassification", "token-classify": "DebertaV2ForTokenClassification",
         "fill-mask": "DebertaV2ForMaskedLM"}
PAIRS = [("Now is the winter of our discontent made glorious summer by this sun.", "Now are our brows bound."),
         ("A horse! a horse! my kingdom for a horse!", "Withdraw, my lord."),
         ("To be", "or not to be")]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unigram_tokenizer(tmp_path_factory.mktemp("deberta-tok"))


class _Checkpoints(dict):
    """(shape, task) -> checkpoint dir, saved on first use; "fill-mask-enhanced" is the lm_predictions head (legacy
    false); ("trained", "classify") a v3 classifier trained a little: the int8 variant is judged by top-1
    agreement, which a random head's near ties make a coin toss."""

    def __init__(self, root: Path, tok_dir: Path) -> None:
        super().__init__()
        self.root, self.tok_dir = root, tok_dir

    def __missing__(self, key: tuple[str, str]) -> Path:
        shape, task = key
        if shape == "trained":
            path = save_checkpoint(self.root / "trained", HEADS["classify"], self.tok_dir, train_steps=40)
        else:
            extra = {"legacy": False} if task == "fill-mask-enhanced" else {}
            path = save_checkpoint(self.root / f"{shape}-{task}", _hf_class(task).__name__, self.tok_dir,
                                   **SHAPES[shape], **extra)
        self[key] = path
        return path


@pytest.fixture(scope="module")
def checkpoints(tok_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> _Checkpoints:
    return _Checkpoints(tmp_path_factory.mktemp("deberta"), tok_dir)


def _hf_class(task: str) -> Any:
    return getattr(transformers, HEADS["fill-mask" if task.startswith("fill-mask") else task])


def _feeds(ckpt: Path, pairs: list[tuple[str, str]], mask_every: int = 0) -> dict[str, torch.Tensor]:
    # longer pairs are cut to the model's positions (the same ids go to every side of a comparison)
    return pair_feeds(ckpt, pairs, mask_every, limit=MAX_POSITIONS)


def _close_on_real(got: torch.Tensor | np.ndarray, ref: torch.Tensor, mask: torch.Tensor, task: str) -> float:
    d = (torch.as_tensor(got) - ref).abs()
    return float((d if task == "classify" else d[mask.bool()]).max())


def test_the_test_batch_reaches_the_far_buckets(checkpoints) -> None:
    feeds = _feeds(checkpoints["v3", "classify"], PAIRS)
    width = feeds["input_ids"].shape[1]
    assert width > 4 * 8 and width < MAX_POSITIONS     # well past 8 buckets, within the model's positions
    assert (~feeds["attention_mask"].bool()).any() and (feeds["token_type_ids"] == 1).any()


@pytest.mark.parametrize("shape, task", [(s, t) for s in ("v3", "v2") for t in (*HEADS, "fill-mask-enhanced")]
                         + [("c2p", "classify"), ("c2p", "fill-mask-enhanced"), ("absolute", "classify")])
def test_hf_checkpoint_loads_into_ours_and_matches_transformers(checkpoints, shape: str, task: str) -> None:
    from training.checkpoint import load_model

    ckpt = checkpoints[shape, task]
    ours, config = load_model(ckpt)          # HF's own file, strictly (no missing / foreign keys)
    assert config.legacy == (task != "fill-mask-enhanced")
    hf = _hf_class(task).from_pretrained(ckpt).eval()
    feeds = _feeds(ckpt, PAIRS, mask_every=4 if task.startswith("fill-mask") else 0)
    with torch.no_grad():
        ref = hf(**feeds).logits
        got = ours(**feeds)
        other = ours(**{**feeds, "input_ids": feeds["input_ids"].flip(0)})
    assert _close_on_real(got, ref, feeds["attention_mask"], task) <= 1e-5
    assert float((other - got).abs().max()) > 1e-3      # the comparison is not between two constants
    if SHAPES[shape].get("type_vocab_size"):            # token types reach the model
        with torch.no_grad():
            untyped = ours(**{**feeds, "token_type_ids": torch.zeros_like(feeds["token_type_ids"])})
        assert float((untyped - got).abs().max()) > 1e-4


def test_bucket_tables_equal_transformers_relative_positions() -> None:
    """Every (i, j) of the longest sequence: our c2p / p2c rows equal transformers' bucketed, clipped positions."""
    from transformers.models.deberta_v2 import modeling_deberta_v2 as hf_mod

    from training.deberta_v2 import DebertaV2Config, relative_index_tables

    for buckets, max_rel in ((8, -1), (8, 20), (256, 512), (-1, 16)):
        n = 512 if buckets == 256 else MAX_POSITIONS
        cfg = DebertaV2Config(max_position_embeddings=n, relative_attention=True, position_buckets=buckets,
                              max_relative_positions=max_rel, pos_att_type=["c2p", "p2c"], hidden_size=64,
                              num_attention_heads=4)
        c2p, p2c = relative_index_tables(cfg)
        x = torch.zeros(1, n, 1)
        rel = hf_mod.build_relative_position(x, x, bucket_size=buckets, max_position=cfg.max_relative)[0]
        span = cfg.att_span
        pos = torch.arange(n)
        index = pos[:, None] - pos[None, :] + n - 1
        assert torch.equal(c2p[index], torch.clamp(rel + span, 0, 2 * span - 1))
        assert torch.equal(p2c[index], torch.clamp(-rel + span, 0, 2 * span - 1))


@pytest.mark.parametrize("shape", ["v3", "v2"])
def test_our_checkpoint_loads_in_transformers(checkpoints, tmp_path: Path, shape: str) -> None:
    from training.checkpoint import load_model, save_model

    for task in (*HEADS, "fill-mask-enhanced"):
        ours, _ = load_model(checkpoints[shape, task])
        with torch.no_grad():  # every weight differs from the file it came from
            for p in ours.parameters():
                p.add_(0.01 * torch.randn_like(p))
        save_model(ours, tmp_path / task)
        hf, info = _hf_class(task).from_pretrained(tmp_path / task, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], (task, info)
        feeds = _feeds(checkpoints[shape, task], PAIRS)
        with torch.no_grad():
            assert _close_on_real(ours(**feeds), hf.eval()(**feeds).logits, feeds["attention_mask"], task) <= 1e-5


@pytest.mark.parametrize("shape", SHAPES)
def test_parameter_names_and_shapes_equal_transformers(tok_dir: Path, shape: str) -> None:
    from training.checkpoint import FAMILY_CONFIG, KINDS
    from tests.deberta_models import hf_config

    for kind in ("deberta-v2-mlm", "deberta-v2-classifier", "deberta-v2-token-classifier"):
        cls, arch, family = KINDS[kind]
        for legacy in ((True, False) if kind.endswith("mlm") else (True,)):
            cfg = hf_config(99, legacy=legacy, num_labels=3, **SHAPES[shape])
            ours = cls(FAMILY_CONFIG[family].from_hf_dict(cfg.to_dict()))
            hf = getattr(transformers, arch)(cfg)
            assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == {
                k: tuple(v.shape) for k, v in hf.state_dict().items()}


def test_ignored_keys_load_and_a_head_of_the_other_layout_is_refused(checkpoints, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from training.checkpoint import CheckpointError, load_model

    # v3 checkpoints may carry what transformers ignores: an unused absolute table and the RTD head.
    src = checkpoints["v3", "fill-mask-enhanced"]
    d = tmp_path / "extra"
    d.mkdir()
    for f in src.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    sd = load_file(str(src / "model.safetensors"))
    sd["deberta.embeddings.position_embeddings.weight"] = torch.zeros(MAX_POSITIONS, 64)
    sd["mask_predictions.dense.weight"] = torch.zeros(64, 64)
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    load_model(d)
    # The same file under legacy true: transformers would build a fresh cls.predictions head; we refuse by name.
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "legacy": True}))
    with pytest.raises(CheckpointError, match="legacy: config says true, but the weights hold the lm_predictions"):
        load_model(d)


@pytest.mark.parametrize("key, value, match", [("pos_att_type", ["c2p", "p2p"], "pos_att_type: unsupported"),
                                               ("pooler_hidden_size", 32, "pooler_hidden_size"),
                                               ("legacy_untied", None, "tie_word_embeddings")])
def test_unsupported_settings_are_refused_by_name(checkpoints, tmp_path: Path, key: str, value: Any,
                                                  match: str) -> None:
    from export import ExportConfig, export_checkpoint
    from export.errors import ExportError

    src = checkpoints["v3", "fill-mask"]
    d = tmp_path / "ckpt"
    d.mkdir()
    for f in src.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((d / "config.json").read_text())
    cfg.update({"tie_word_embeddings": False} if key == "legacy_untied" else {key: value})
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ExportError, match=match):
        export_checkpoint(ExportConfig(checkpoint=d, task="fill-mask", repository=tmp_path / "r", name="x"))


def test_optimized_variant_is_refused_by_name(checkpoints, tmp_path: Path) -> None:
    """onnxruntime has no fused op for disentangled attention; its BERT fusions were measured no faster."""
    from export import ExportConfig, export_checkpoint
    from export.errors import ExportError

    with pytest.raises(ExportError, match="--variants optimized: DeBERTa's disentangled attention"):
        export_checkpoint(ExportConfig(checkpoint=checkpoints["v3", "classify"], task="classify",
                                       repository=tmp_path / "r", name="x", variants=("fp32", "optimized")))
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


def test_heads_transformers_has_and_we_do_not_are_refused_by_architecture(checkpoints, tmp_path: Path) -> None:
    from export import ExportConfig, export_checkpoint
    from export.errors import ExportError

    d = tmp_path / "qa"
    d.mkdir()
    cfg = json.loads((checkpoints["v3", "classify"] / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "architectures": ["DebertaV2ForQuestionAnswering"]}))
    with pytest.raises(ExportError, match="unsupported architecture 'DebertaV2ForQuestionAnswering'"):
        export_checkpoint(ExportConfig(checkpoint=d, task="classify", repository=tmp_path / "r", name="x"))


# ----------------------------------------------------------------------------- export + onnxruntime


@pytest.fixture(scope="module")
def exported(checkpoints, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """classify (v3: fp32 + int8; v2: fp32), fill-mask (both head layouts), token-classify and embed packages."""
    from tests.conftest import one_torch_thread

    from export import ExportConfig, export_checkpoint

    repo = tmp_path_factory.mktemp("deberta-repo")
    plan = {"v3-classify": (("v3", "classify"), "classify", ("fp32",)),
            "trained-classify": (("trained", "classify"), "classify", ("fp32", "int8")),
            "v2-classify": (("v2", "classify"), "classify", ("fp32",)),
            "v3-fill-mask": (("v3", "fill-mask"), "fill-mask", ("fp32",)),
            "v3-fill-mask-enhanced": (("v3", "fill-mask-enhanced"), "fill-mask", ("fp32",)),
            "v2-token-classify": (("v2", "token-classify"), "token-classify", ("fp32",)),
            "v3-embed": (("v3", "classify"), "embed", ("fp32",))}
    reports = {}
    with one_torch_thread():
        for name, (key, task, variants) in plan.items():
            r = export_checkpoint(ExportConfig(checkpoint=checkpoints[key], task=task, repository=repo, name=name,
                                               variants=variants))
            reports[name] = r.parity
    return {"repo": repo, "reports": reports}


def _session(package: Path, variant: str = "fp32"):
    import onnxruntime

    m = json.loads((package / "model.json").read_text())
    return onnxruntime.InferenceSession(str(package / m["variants"][variant]), providers=["CPUExecutionProvider"]), m


@pytest.mark.parametrize("name, key", [("v3-classify", ("v3", "classify")), ("v2-classify", ("v2", "classify")),
                                       ("v3-fill-mask", ("v3", "fill-mask")),
                                       ("v3-fill-mask-enhanced", ("v3", "fill-mask-enhanced")),
                                       ("v2-token-classify", ("v2", "token-classify"))])
def test_onnxruntime_equals_transformers_on_padded_pairs_longer_than_the_trace(exported, checkpoints, name: str,
                                                                                key: tuple[str, str]) -> None:
    package = exported["repo"] / name / "1"
    assert exported["reports"][name]["variants"]["fp32"]["passed"]
    sess, m = _session(package)
    names = [i["name"] for i in m["inputs"]]
    typed = bool(SHAPES[key[0]].get("type_vocab_size"))
    assert names == (["input_ids", "attention_mask", "token_type_ids"] if typed else ["input_ids", "attention_mask"])
    assert m["architecture"] == "deberta-v2" and m["max_length"] == MAX_POSITIONS
    task = key[1]
    feeds = _feeds(checkpoints[key], PAIRS, mask_every=4 if task.startswith("fill-mask") else 0)
    assert feeds["input_ids"].shape[1] > 5 * 8           # the trace had 5 tokens
    hf = _hf_class(task).from_pretrained(checkpoints[key]).eval()
    with torch.no_grad():
        ref = hf(**feeds).logits
    got = sess.run(["logits"], {n: feeds[n].numpy() for n in names})[0]
    assert _close_on_real(got, ref, feeds["attention_mask"], task) <= 1e-4
    # the longest sequence the package allows, one row, still equal
    long_ids = feeds["input_ids"][:1, :1].repeat(1, MAX_POSITIONS)
    long_ids[0, 1:] = torch.randint(5, hf.config.vocab_size, (MAX_POSITIONS - 1,), generator=torch.Generator().manual_seed(3))
    long = {"input_ids": long_ids, "attention_mask": torch.ones_like(long_ids),
            "token_type_ids": (torch.arange(MAX_POSITIONS) >= 40).long()[None]}
    with torch.no_grad():
        ref = hf(**long).logits
    got = sess.run(["logits"], {n: long[n].numpy() for n in names})[0]
    assert _close_on_real(got, ref, long["attention_mask"], task) <= 1e-4


def test_int8_variant_agrees_with_transformers(exported, checkpoints) -> None:
    import onnx

    report = exported["reports"]["trained-classify"]["variants"]["int8"]
    assert report["passed"], report
    package = exported["repo"] / "trained-classify" / "1"
    sess, m = _session(package, "int8")
    assert "MatMulIntegerToFloat" in {n.op_type for n in onnx.load(str(package / m["variants"]["int8"])).graph.node}
    ckpt = checkpoints["trained", "classify"]
    hf = _hf_class("classify").from_pretrained(ckpt).eval()
    from export.heldout import BUILTIN_TEXTS

    texts = list(BUILTIN_TEXTS)
    pairs = list(zip(texts[0::2], texts[1::2]))
    feeds = _feeds(ckpt, pairs)
    with torch.no_grad():
        ref = hf(**feeds).logits.numpy()
    got = sess.run(["logits"], {"input_ids": feeds["input_ids"].numpy(),
                                "attention_mask": feeds["attention_mask"].numpy()})[0]
    agree = float((got.argmax(-1) == ref.argmax(-1)).mean())
    assert agree >= 0.9, agree
    assert float(np.abs(got - ref).max()) > 1e-6      # it is quantized, not the fp32 graph under another name


def test_embed_package_equals_transformers_mean_pooling(exported, checkpoints) -> None:
    sess, m = _session(exported["repo"] / "v3-embed" / "1")
    assert m["task"] == "embed" and m["embedding"]["pooling"] == "mean"
    ckpt = checkpoints["v3", "classify"]
    feeds = _feeds(ckpt, PAIRS)
    hf = transformers.AutoModel.from_pretrained(ckpt).eval()
    assert type(hf).__name__ == "DebertaV2Model"
    with torch.no_grad():
        hidden = hf(**feeds).last_hidden_state
    keep = feeds["attention_mask"][..., None].float()
    want = ((hidden * keep).sum(1) / keep.sum(1)).numpy()
    got = sess.run(["embeddings"], {"input_ids": feeds["input_ids"].numpy(),
                                    "attention_mask": feeds["attention_mask"].numpy()})[0]
    assert float(np.abs(got - want).max()) <= 1e-4


def test_gate_fails_on_a_perturbed_deberta_graph(checkpoints, tmp_path: Path, monkeypatch) -> None:
    from export import ExportConfig, export_checkpoint
    from export.errors import ParityFailure

    monkeypatch.setenv("ORTSERVE_EXPORT_PERTURB", "fp32")
    with pytest.raises(ParityFailure):
        export_checkpoint(ExportConfig(checkpoint=checkpoints["v3", "classify"], task="classify",
                                       repository=tmp_path / "repo", name="bad"))
    assert not (tmp_path / "repo" / "bad" / "1").exists()


def test_labels_reach_the_manifest(exported) -> None:
    m = json.loads((exported["repo"] / "v3-classify" / "1" / "model.json").read_text())
    assert m["labels"] == LABELS
    m = json.loads((exported["repo"] / "v3-fill-mask" / "1" / "model.json").read_text())
    assert m["mask_token"] == "[MASK]"
