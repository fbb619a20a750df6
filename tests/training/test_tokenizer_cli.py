"""`python -m training tokenizer`: a real run trains a byte-level BPE tokenizer that loads and round-trips."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
