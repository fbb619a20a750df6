"""CMUdict grapheme-to-phoneme: a short real run of `python -m training g2p` whose checkpoint transformers loads as
MarianMTModel, its quiet mode and its one-line errors. (The dictionary, word split, error rates, symbol table and
length buckets are tests/unit/test_g2p_data.py.)"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TINY = ["--preset", "tiny", "--max-words", "300", "--eval-words", "40", "--threads", "1"]


def run_cli(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "training", "g2p", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def test_g2p_trains_and_its_checkpoint_is_a_marian_mt_model(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "g2p"
    r = run_cli(*TINY, "--steps", "40", "--out", out, "--progress", "on")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "g2p: 100%|" in r.stderr and "40/40" in r.stderr  # the step bar, even into a pipe, with on
    summary = json.loads(r.stdout)
    for split in ("validation", "test"):
        assert set(summary[split]) >= {"wer", "per", "wer_no_stress", "per_no_stress", "words"}
        assert summary[split]["words"] == 40
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["train_loss_last"] < metrics["train_loss_first"] - 0.5
    assert len(metrics["test"]["examples"]) == 5
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["MarianMTModel"] and cfg["scale_embedding"] and cfg["forced_eos_token_id"] is None

    from training.checkpoint import load_model
    from training.seq2seq import generate_greedy

    ours, _ = load_model(out)
    hf = transformers.MarianMTModel.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    batch = tok(["cat", "shakespeare", "Ortserve"], return_tensors="pt", padding=True)
    for row, mask in zip(batch["input_ids"], batch["attention_mask"]):  # our table, through transformers: ... </s>
        assert int(row[int(mask.sum()) - 1]) == tok.eos_token_id == 1
    want = hf.generate(**batch, max_new_tokens=12, do_sample=False, num_beams=1)
    got = generate_greedy(ours, batch["input_ids"], batch["attention_mask"], 12)
    assert torch.equal(got, want[:, 1:])


def test_quiet_run_shows_no_bar(tmp_path: Path) -> None:
    r = run_cli(*TINY, "--steps", "2", "--out", tmp_path / "q", "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "%|" not in r.stderr


@pytest.mark.parametrize("args,message", [
    (["--dictionary", "/nonexistent/cmudict.dict"], "error: --dictionary: /nonexistent/cmudict.dict is not a file"),
    (["--d-model", "30", "--heads", "4"], "error: heads: 4 does not divide d_model=30"),
    (["--max-length", "80"], "error: max_length: at most 63, got 80"),
])
def test_bad_settings_are_one_line_errors(tmp_path: Path, args: list[str], message: str) -> None:
    r = run_cli(*TINY, "--out", tmp_path / "x", *args)
    assert r.returncode == 2 and r.stderr.strip() == message, r.stderr
    assert not (tmp_path / "x").exists()
