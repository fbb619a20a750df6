"""User-data errors through the training CLI (exit 2, one line) and `python -m training data` writing the split.
(The corpus fetch/cleaning and the genre split themselves are tests/unit/test_corpus_data.py.)"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
