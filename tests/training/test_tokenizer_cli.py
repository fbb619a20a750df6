"""`python -m training tokenizer`: a real run trains a byte-level BPE tokenizer that loads and round-trips."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import tiny_corpus
from training.tokenizer import load_tokenizer


def test_cli_trains_a_tokenizer(tmp_path: Path) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("Shall I compare thee to a summer's day?\nThou art more lovely and more temperate.\n" * 50)
    out = tmp_path / "bpe"
    r = subprocess.run([sys.executable, "-m", "training", "tokenizer", "--kind", "bpe", "--corpus", str(corpus),
                        "--vocab-size", "400", "--out", str(out), "--quiet"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    info = load_tokenizer(out)
    assert info.kind == "bpe" and info.vocab_size <= 400
    assert info.tokenizer.decode(info.tokenizer.encode("summer's day").ids) == "summer's day"


def test_wordpiece_training_is_the_same_in_every_process(tmp_path: Path) -> None:
    """The tests' WordPiece corpus trained by four separate processes: byte-identical tokenizer.json files.
    tokenizers' own WordPieceTrainer numbers its `##` pieces in hash-map order, which changes per process and
    breaks merge-count ties differently (huggingface/tokenizers#1794), so most processes made a vocabulary of
    their own near the vocab_size cut."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(tiny_corpus()) + "\n", encoding="utf-8")
    outs = [tmp_path / f"wp{i}" for i in range(4)]
    procs = [subprocess.Popen([sys.executable, "-m", "training", "tokenizer", "--kind", "wordpiece",
                               "--corpus", str(corpus), "--vocab-size", "400", "--min-frequency", "1",
                               "--out", str(out), "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for out in outs]
    for p in procs:
        _, err = p.communicate()
        assert p.returncode == 0, err
    distinct = {(out / "tokenizer.json").read_bytes() for out in outs}
    assert len(distinct) == 1, f"{len(distinct)} different tokenizer.json files from {len(outs)} processes"
    info = load_tokenizer(outs[0])
    assert info.kind == "wordpiece" and info.vocab_size == 400
