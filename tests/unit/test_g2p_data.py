"""CMUdict grapheme-to-phoneme data: the dictionary and its word split, the error rates, the symbol table, length
buckets (in-process; the real `python -m training g2p` runs are tests/training/test_g2p.py)."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from training.cmudict import build_tokenizer, load_lexicon, parse, split_of, strip_stress
from training.data import DataError
from training.metrics import edit_distance, sequence_error_rates
from training.tasks.g2p import LengthBuckets


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
