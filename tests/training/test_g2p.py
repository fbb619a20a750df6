"""CMUdict grapheme-to-phoneme: the dictionary and its word split, the error rates, the symbol table, length
buckets, and a short real run of `python -m training g2p` whose checkpoint transformers loads as MarianMTModel."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from training.cmudict import build_tokenizer, load_lexicon, parse, split_of, strip_stress
from training.data import DataError
from training.metrics import edit_distance, sequence_error_rates
from training.tasks.g2p import LengthBuckets

TINY = ["--preset", "tiny", "--max-words", "300", "--eval-words", "40", "--threads", "1"]


def run_cli(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "training", "g2p", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def lexicon():
    return load_lexicon()


def test_parse_folds_variants_and_drops_comments() -> None:
    lex = parse("a AH0\na(2) EY1\naalborg AO1 L B AO0 R G # place, danish\n\n")
    assert lex == {"a": [("AH0",), ("EY1",)], "aalborg": [("AO1", "L", "B", "AO0", "R", "G")]}
    with pytest.raises(DataError, match="line 2"):
        parse("a AH0\nbad ah0\n")


def test_split_is_by_word_hash_and_holds_out_five_percent(lexicon) -> None:
    # The documented rule, computed here from its definition: sha1(word)[:8] as hex, mod 100; 0-1, 2-4.
    for word in ("shakespeare", "cat", "'til", "zywicki"):
        bucket = int(hashlib.sha1(word.encode()).hexdigest()[:8], 16) % 100
        assert split_of(word) == ("validation" if bucket < 2 else "test" if bucket < 5 else "train")
    counts = lexicon.counts()
    total = sum(c["words"] for c in counts.values())
    assert total == 126052  # distinct words of cmudict 1.1.3
    assert 0.017 < counts["validation"]["words"] / total < 0.023
    assert 0.027 < counts["test"]["words"] / total < 0.033
    seen = [w for rows in lexicon.splits.values() for w, _ in rows]
    assert len(seen) == len(set(seen))  # a word and all its pronunciations live in one split
    assert all(len(prons) >= 1 for rows in lexicon.splits.values() for _, prons in rows)


def test_error_rates_take_the_closest_pronunciation() -> None:
    assert edit_distance("kitten", "sitting") == 3 and edit_distance([], ["A"]) == 1
    hyps = [("K", "AE1", "T"), ("T", "AH0", "M", "EY1", "T", "OW2"), ("D", "AO1", "G")]
    refs = [[("K", "AE1", "T")],
            [("T", "AH0", "M", "EY1", "T", "OW2"), ("T", "AH0", "M", "AA1", "T", "OW2")],  # either one is right
            [("D", "AA1", "G"), ("D", "AO1", "G", "Z")]]  # one edit from both: the longer reference counts
    r = sequence_error_rates(hyps, refs)
    assert r["wer"] == pytest.approx(1 / 3) and r["per"] == pytest.approx(1 / (3 + 6 + 4))
    assert strip_stress(("AH0", "B", "IY1")) == ("AH", "B", "IY")


def test_symbol_table_encodes_characters_and_decodes_phonemes(lexicon, tmp_path: Path) -> None:
    from training.tokenizer import load_tokenizer, save_tokenizer

    tok = build_tokenizer(lexicon.graphemes, lexicon.phonemes)
    vocab = tok.get_vocab()
    assert [vocab[t] for t in ("<pad>", "</s>", "<unk>")] == [0, 1, 2]
    assert set(lexicon.graphemes) == set("abcdefghijklmnopqrstuvwxyz'-.")
    assert len(lexicon.phonemes) == 69 and "AH0" in vocab and "ZH" in vocab
    enc = tok.encode("Cat's")
    assert enc.tokens == ["c", "a", "t", "'", "s", "</s>"]
    assert tok.encode("ñ").tokens == ["<unk>", "</s>"]
    assert tok.decode([vocab["K"], vocab["AE1"], vocab["T"], 1, 0]) == "K AE1 T"
    info = load_tokenizer(save_tokenizer(tok, tmp_path / "tok", "wordlevel", 33))
    assert info.kind == "wordlevel" and info.pad_id == 0 and info.eos_id == 1 and info.unk_id == 2


def test_length_buckets_cover_each_example_once_per_epoch_with_similar_lengths() -> None:
    import random

    rng = random.Random(0)
    lengths = [rng.randint(3, 30) for _ in range(1000)]
    order = LengthBuckets(lengths, 32, seed=5, window=8)
    epoch = [order.indices(s) for s in range(order.per_epoch)]
    flat = [i for b in epoch for i in b]
    assert len(flat) == len(set(flat)) == 31 * 32
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in epoch) / len(epoch)
    assert spread < 8  # a random batch of 32 from 3..30 spans ~25
    again = LengthBuckets(lengths, 32, seed=5, window=8)
    assert again.indices(order.per_epoch + 3) == order.indices(order.per_epoch + 3)  # resume sees the same
    assert order.indices(0) != LengthBuckets(lengths, 32, seed=6, window=8).indices(0)


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
