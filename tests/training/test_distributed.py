"""torchrun with 2 CPU processes (gloo) gives the same loss per step as 1 process, same global batch."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from training.data import fetch_shakespeare, lines_to_documents, load_plays
from training.tokenizer import TokenizerConfig, save_tokenizer, train_tokenizer


def _losses(out: Path) -> list[float]:
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "lr" in r]


@pytest.mark.parametrize("task", ["mlm", "lm"])
def test_two_processes_match_one(tmp_path: Path, task: str) -> None:
    lines = load_plays(fetch_shakespeare(), ["macbeth"])
    corpus = tmp_path / "macbeth.txt"
    corpus.write_text("\n\n".join(lines_to_documents(lines["macbeth"])))
    kind = "wordpiece" if task == "mlm" else "bpe"
    tok = save_tokenizer(train_tokenizer([corpus.read_text()], TokenizerConfig(kind=kind, vocab_size=800)),
                         tmp_path / "tok", kind, 128)
    # Odd global batch: the 2 shards differ in size, and MLM shards in masked-token count.
    args = [task, "--tokenizer", str(tok), "--corpus", str(corpus), "--preset", "tiny", "--batch-size", "7",
            "--max-length", "48", "--steps", "4", "--warmup", "0", "--lr", "1e-3", "--dropout", "0",
            "--eval-every", "0", "--threads", "1", "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, "-m", "training", *args, "--out", str(tmp_path / "one")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "training", *args, "--out", str(tmp_path / "two")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert two.returncode == 0, two.stderr[-2000:]
    a, b = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert len(a) == len(b) == 4
    assert a == pytest.approx(b, abs=1e-5)
    assert a[0] != pytest.approx(a[-1], abs=1e-3)  # the weights really moved between steps
    assert json.loads((tmp_path / "two" / "metrics.json").read_text())["world_size"] == 2
