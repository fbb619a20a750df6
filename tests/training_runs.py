"""Shared by the training runs' tests: the `python -m training` command line, the tiny settings, a run's losses,
and sentence-pair data cut from the corpus (tests/training/conftest.py builds the corpus)."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

PLAYS = ["macbeth", "tempest"]
TINY = ["--preset", "tiny", "--batch-size", "8", "--max-length", "64", "--threads", "1", "--quiet"]


def run_cli(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "training", *map(str, args)], capture_output=True, text=True,
                       timeout=300)
    if check:
        assert r.returncode == 0, r.stderr[-3000:]
    return r


def train_losses(out: Path) -> list[float]:
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "lr" in r]


def learned(losses: list[float]) -> bool:
    return sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.05


MLM_ARGS = ["--schedule", "constant", "--warmup", "0", "--lr", "2e-3", "--eval-examples", "32"]


def pair_files(d: Path, corpus: Path) -> list[Path]:
    """Sentence pairs, label 'next' (B follows A) or 'odd' (B is a nonsense refrain): learnable fast."""
    lines = [ln for ln in (corpus / "macbeth.txt").read_text().splitlines() if len(ln.split()) > 3]
    rng = random.Random(0)
    paths = []
    for name, n in (("train", 96), ("validation", 16), ("test", 16)):
        rows = []
        for _ in range(n):
            i = rng.randrange(len(lines) - 1)
            if rng.random() < 0.5:
                rows.append({"text": lines[i], "text_pair": lines[i + 1], "label": "next"})
            else:
                rows.append({"text": lines[i], "text_pair": "hey nonny nonny " * 3, "label": "odd"})
        p = d / f"{name}.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(p)
    return paths
