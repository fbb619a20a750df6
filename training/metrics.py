"""Evaluation figures (accuracy, macro-F1, top-k, perplexity, word / phoneme error rates) and the JSONL
metrics log."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

import torch


def classification_metrics(preds: Sequence[int], golds: Sequence[int], labels: Sequence[str]) -> dict[str, Any]:
    """Accuracy, macro-F1 (mean of per-class F1, classes absent from both count as 0) and per-class F1."""
    n = len(golds)
    if n == 0:
        raise ValueError("evaluation: no examples")
    correct = sum(int(p == g) for p, g in zip(preds, golds))
    per_class = {}
    for i, name in enumerate(labels):
        tp = sum(1 for p, g in zip(preds, golds) if p == i and g == i)
        fp = sum(1 for p, g in zip(preds, golds) if p == i and g != i)
        fn = sum(1 for p, g in zip(preds, golds) if p != i and g == i)
        per_class[name] = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
    return {
        "accuracy": correct / n,
        "macro_f1": sum(per_class.values()) / len(labels),
        "f1_per_class": per_class,
        "examples": n,
    }


def topk_hits(logits: torch.Tensor, targets: torch.Tensor, ks: Sequence[int] = (1, 5)) -> dict[int, int]:
    """How many rows of `logits` [N, V] have `targets` [N] among their top-k, for each k."""
    top = logits.topk(max(ks), dim=-1).indices
    hit = top == targets[:, None]
    return {k: int(hit[:, :k].any(dim=-1).sum()) for k in ks}


def perplexity(total_nll: float, tokens: int) -> float:
    return math.exp(total_nll / tokens) if tokens else float("nan")


def edit_distance(a: Sequence[str], b: Sequence[str]) -> int:
    """Levenshtein distance between two symbol sequences (substitution, insertion, deletion: 1 each)."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def sequence_error_rates(hyps: Sequence[Sequence[str]], refs: Sequence[Sequence[Sequence[str]]]) -> dict[str, Any]:
    """Word error rate (share of outputs equal to none of their references) and symbol error rate (edits to
    the closest reference, summed, over the summed lengths of those references) for outputs with one or
    more acceptable references each (CMUdict's several pronunciations of a word)."""
    if not hyps or len(hyps) != len(refs):
        raise ValueError(f"evaluation: {len(hyps)} outputs for {len(refs)} reference sets")
    wrong = edits = length = 0
    for hyp, options in zip(hyps, refs):
        h = tuple(hyp)
        best = min(((edit_distance(h, r), len(r)) for r in options), key=lambda t: (t[0], -t[1]))
        wrong += int(best[0] > 0)
        edits += best[0]
        length += best[1]
    return {"wer": wrong / len(hyps), "per": edits / max(length, 1), "words": len(hyps), "phonemes": length}


class MetricsLog:
    """Appends one JSON object per line to metrics.jsonl (flushed each time, so it can be tailed)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
