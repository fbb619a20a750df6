"""Encoder-decoder export (issue 26): encoder.onnx + decoder.onnx behind the parity gate.

Checkpoints are random Hugging Face Marian / BART / T5 models built by `transformers` from small configs
(testing/seq2seq_checkpoints.py) and our g2p-layout Marian; the references are `transformers` itself (logits of
a padded batch, greedy `generate`) and our PyTorch model, never the code under test. The ONNX side is read with
plain onnxruntime sessions (testing/seq2seq_offline.py, no slot buffers) or with IOBinding over slot buffers.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from export import ExportConfig, ParityFailure, export_checkpoint
from modelpkg import Manifest, ManifestError, past_names
from testing import seq2seq_offline as offline
from testing.seq2seq_checkpoints import MODELS, char_tokenizer, export_repository, hf_model, write_checkpoint
from tests.server_process import ROOT as REPO_ROOT

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)

FAMILIES = ["marian", "marian-two-vocabs", "marian-odd-heads", "bart", "t5", "t5-gated"]
WORDS = ["Shakespeare", "cat", "ortserve runs!", "a"]


@pytest.fixture(scope="module")
def packages(tmp_path_factory) -> dict[str, Path]:
    """Each family's checkpoint exported once (the gate ran: publication means it passed)."""
    return export_repository(tmp_path_factory.mktemp("s2s-export"), FAMILIES)


def _sources(name: str) -> list[list[int]]:
    _, _, kw, specials = MODELS[name]
    tok = char_tokenizer(specials, kw["vocab_size"])
    return [tok.encode(w).ids for w in WORDS]


def _padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and their mask (by length: a decoder start token may be the pad id)."""
    ids = torch.full((len(rows), max(map(len, rows))), pad)
    for r, row in enumerate(rows):
        ids[r, :len(row)] = torch.tensor(row)
    return ids, (torch.arange(ids.shape[1])[None] < torch.tensor([len(r) for r in rows])[:, None]).long()


@pytest.mark.parametrize("name", FAMILIES)
def test_logits_of_a_padded_batch_equal_transformers(packages: dict[str, Path], name: str) -> None:
    """Sources of 12/4/14/2 tokens and targets of 5/2/7/3 in one padded batch: the encoder on the batch, the
    decoder's first call over it, against transformers' forward with both masks."""
    pkg = offline.load_package(packages[name])
    spec = pkg.spec
    sources = _sources(name)
    g = np.random.default_rng(7)
    targets = [[spec.decoder_start_token_id] + g.integers(3, spec.target_vocab_size, n - 1).tolist()
               for n in (5, 2, 7, 3)]
    src, src_mask = _padded(sources, spec.pad_token_id)
    tgt, tgt_mask = _padded(targets, spec.pad_token_id)
    with torch.no_grad():
        want = hf_model(name)(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt,
                              decoder_attention_mask=tgt_mask).logits.numpy()
    cross = dict(zip(spec.cross_names, pkg.encoder.run(spec.cross_names, {"input_ids": src.numpy(),
                                                                          "attention_mask": src_mask.numpy()})))
    empty = np.zeros((len(targets), spec.num_heads, 0, spec.head_dim), np.float32)
    got = pkg.decoder.run(["logits"], {"input_ids": tgt.numpy(), "attention_mask": tgt_mask.numpy(),
                                       "encoder_attention_mask": src_mask.numpy(), **cross,
                                       **{n: empty for n in past_names(spec.num_layers)}})[0]
    assert got.shape == want.shape == (4, 7, spec.target_vocab_size)
    for r, t in enumerate(targets):
        np.testing.assert_allclose(got[r, :len(t)], want[r, :len(t)], atol=1e-4, rtol=1e-4)
    assert np.abs(want).max() > 0.5   # logits of a real size: a 1e-4 match means something


@pytest.mark.parametrize("name", FAMILIES)
def test_decoding_through_the_cache_equals_transformers(packages: dict[str, Path], name: str) -> None:
    """A 9-token target fed one token per call through the growing self cache (random weights make greedy
    outputs repetitive, so this carries the position and cache checks): every step's logits equal transformers'
    full forward over the target."""
    pkg = offline.load_package(packages[name])
    spec = pkg.spec
    source = _sources(name)[2]
    target = [spec.decoder_start_token_id] + np.random.default_rng(3).integers(3, spec.target_vocab_size, 8).tolist()
    with torch.no_grad():
        want = hf_model(name)(input_ids=torch.tensor([source]),
                              decoder_input_ids=torch.tensor([target])).logits[0].numpy()
    np.testing.assert_allclose(offline.stepped_logits(pkg, source, target), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", FAMILIES)
def test_offline_greedy_equals_transformers_generate(packages: dict[str, Path], name: str) -> None:
    pkg = offline.load_package(packages[name])
    sources = _sources(name)
    src, mask = _padded(sources, pkg.spec.pad_token_id)
    with torch.no_grad():
        want = hf_model(name).generate(input_ids=src, attention_mask=mask, max_new_tokens=10, do_sample=False,
                                       num_beams=1)[:, 1:].tolist()
    for source, row in zip(sources, want):
        got = offline.greedy(pkg, source, 10)
        assert got == row[:len(got)] and all(t == pkg.spec.pad_token_id for t in row[len(got):]), (source, got, row)


def test_manifest_block_describes_the_graphs(packages: dict[str, Path]) -> None:
    m = Manifest.from_json((packages["t5-gated"] / "model.json").read_text())
    spec = m.encoder_decoder
    assert m.task == "generate" and m.architecture == "t5" and m.cache.layout == "inplace"
    assert (spec.family, spec.num_layers, spec.num_heads, spec.head_dim, spec.model_head_dim) == ("t5", 2, 4, 16, 6)
    assert (spec.max_source_length, spec.max_target_length) == (512, 512) == (m.max_length, 512)
    assert (spec.decoder_start_token_id, spec.eos_token_id, spec.pad_token_id) == (0, 1, 0)
    assert spec.graphs == {"fp32": {"encoder": "encoder.onnx", "decoder": "decoder.onnx"}}
    assert m.variants == {"fp32": "decoder.onnx"} and spec.target_tokenizer is None
    assert [t.name for t in spec.encoder_outputs] == spec.cross_names
    assert [t.name for t in m.inputs][:3] == ["input_ids", "attention_mask", "encoder_attention_mask"]
    pkg = offline.load_package(packages["t5-gated"])   # the manifest's names are the graphs'
    assert [i.name for i in pkg.decoder.get_inputs()] == [t.name for t in m.inputs]
    assert [o.name for o in pkg.encoder.get_outputs()] == spec.cross_names
    parity = json.loads((packages["t5-gated"] / "parity.json").read_text())
    names = [c["name"] for c in parity["variants"]["fp32"]["checks"]]
    assert parity["passed"] and any(n.startswith("slot reused") for n in names)
    assert any(n.startswith("transformers T5ForConditionalGeneration") for n in names)
    assert {"encoder.onnx", "decoder.onnx", "tokenizer.json"} <= set(parity["files"])
    bart = Manifest.from_json((packages["bart"] / "model.json").read_text()).encoder_decoder
    assert (bart.max_source_length, bart.forced_eos_token_id, bart.decoder_start_token_id) == (40, 2, 2)


def test_two_vocabularies_ship_the_target_tokenizer(packages: dict[str, Path]) -> None:
    pkg_dir = packages["marian-two-vocabs"]
    spec = Manifest.from_json((pkg_dir / "model.json").read_text()).encoder_decoder
    assert (spec.source_vocab_size, spec.target_vocab_size, spec.target_tokenizer) == (60, 45, "target_tokenizer.json")
    texts = offline.greedy_text(pkg_dir, ["cat"], 6)
    ids = offline.greedy(offline.load_package(pkg_dir), [5, 3, 22, 1], 6)
    assert texts[0] and all(tok.startswith("p") for tok in texts[0].split())
    assert max(ids) < 45


def test_g2p_layout_marian_exports_and_decodes_like_our_model(tmp_path: Path) -> None:
    """Our own Transformer in the g2p task's layout (one letters + phonemes vocabulary, sqrt(d) embeddings,
    relu, pad as decoder start), saved by training.checkpoint: the package greedy-decodes as our PyTorch
    model does."""
    from training.checkpoint import save_model
    from training.cmudict import build_tokenizer
    from training.marian import MarianConfig, MarianMTModel
    from training.seq2seq import generate_greedy

    tok = build_tokenizer(list("abcdefghijklmnopqrstuvwxyz'"), ["AA1", "B", "K", "T", "AE1", "S", "P", "IY0"])
    vocab = tok.get_vocab()
    torch.manual_seed(0)
    model = MarianMTModel(MarianConfig(
        vocab_size=len(vocab), d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
        activation_function="relu", scale_embedding=True, pad_token_id=vocab["<pad>"], eos_token_id=vocab["</s>"],
        decoder_start_token_id=vocab["<pad>"], forced_eos_token_id=None, dropout=0.0, init_std=0.3)).eval()
    tok.save(str(tmp_path / "tok.json"))
    save_model(model, tmp_path / "g2p", tokenizer_files={"tokenizer.json": tmp_path / "tok.json"})
    pkg_dir = export_checkpoint(ExportConfig(checkpoint=tmp_path / "g2p", task="generate",
                                             repository=tmp_path / "repo", name="g2p")).package_dir
    pkg = offline.load_package(pkg_dir)
    assert pkg.spec.family == "marian" and pkg.spec.max_source_length == 64 and pkg.spec.target_tokenizer is None
    for word in ("cat", "shakespeare"):
        src = tok.encode(word).ids
        with torch.no_grad():
            want = generate_greedy(model, torch.tensor([src]), None, 12)[0].tolist()
        assert offline.greedy(pkg, src, 12) == want


def test_perturbed_decoder_is_refused_and_nothing_published(tmp_path: Path) -> None:
    ckpt = write_checkpoint("marian", tmp_path / "ckpt")
    proc = subprocess.run([sys.executable, "-m", "export", str(ckpt), "--task", "generate", "--repository",
                           str(tmp_path / "repo"), "--name", "m"], cwd=REPO_ROOT, capture_output=True, text=True,
                          env={**os.environ, "ORTSERVE_EXPORT_PERTURB": "fp32"}, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "parity gate failed" in proc.stderr and "Traceback" not in proc.stderr
    rows = [line for line in proc.stderr.splitlines() if line.startswith("fp32 ") and line.rstrip().endswith("FAIL")]
    assert rows and any(float(r.split()[2]) > 1e-4 for r in rows if r.split()[1] == "logits"), proc.stderr
    assert not (tmp_path / "repo" / "m").exists() or not any((tmp_path / "repo" / "m").iterdir())


def test_perturbed_encoder_is_refused(tmp_path: Path, monkeypatch) -> None:
    ckpt = write_checkpoint("t5", tmp_path / "ckpt")
    monkeypatch.setenv("ORTSERVE_EXPORT_PERTURB", "encoder")
    with pytest.raises(ParityFailure, match="parity gate failed"):
        export_checkpoint(ExportConfig(checkpoint=ckpt, task="generate", repository=tmp_path / "repo", name="t"))
    assert not (tmp_path / "repo" / "t" / "1").exists()


def test_seq2seq_block_rejects_what_a_server_cannot_run(packages: dict[str, Path]) -> None:
    good = json.loads((packages["bart"] / "model.json").read_text())
    assert Manifest.from_dict(good).to_dict() == good   # round trip
    for change, field in (({"family": "gpt2"}, "encoder_decoder.family"),
                          ({"num_heads": 8}, "encoder_decoder.num_heads"),
                          ({"eos_token_id": 60}, "encoder_decoder.eos_token_id"),
                          ({"graphs": {"fp32": {"encoder": "../x.onnx", "decoder": "decoder.onnx"}}},
                           "encoder_decoder.graphs.fp32.encoder"),
                          ({"graphs": {"int8": {"encoder": "e.onnx", "decoder": "d.onnx"}}}, "encoder_decoder.graphs"),
                          ({"max_source_length": 0}, "encoder_decoder.max_source_length")):
        bad = {**good, "encoder_decoder": {**good["encoder_decoder"], **change}}
        with pytest.raises(ManifestError, match=field.replace(".", r"\.")):
            Manifest.from_dict(bad)
    with pytest.raises(ManifestError, match="cache.layout must be inplace"):
        Manifest.from_dict({**good, "cache": {**good["cache"], "layout": "concat"}})
    plain = {k: v for k, v in good.items() if k != "encoder_decoder"}
    assert Manifest.from_dict(plain).encoder_decoder is None
    assert "encoder_decoder" not in Manifest.from_dict(plain).to_dict()


def test_bad_settings_are_one_line_errors(tmp_path: Path, capsys) -> None:
    from export.__main__ import main

    ckpt = write_checkpoint("bart", tmp_path / "ckpt")
    capsys.readouterr()
    base = [str(ckpt), "--task", "generate", "--repository", str(tmp_path / "repo"), "--name", "b"]
    for extra, message in ((["--max-target-length", "8"], "--max-target-length: 8 tokens is below the 16"),
                           (["--max-source-length", "41"], "--max-source-length: 41 is past the model's 40"),
                           (["--variants", "fp32,kv8"], "--variants: an encoder-decoder package ships fp32, w8, w4, "
                                                         "int8 (fp32 required; got fp32, kv8)")):
        assert main(base + extra) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "repo" / "b").exists() or not any((tmp_path / "repo" / "b").iterdir())
