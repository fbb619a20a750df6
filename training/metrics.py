"""Evaluation figures (accuracy, macro-F1, top-k, perplexity) and the JSONL metrics log."""
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


class MetricsLog:
    """Appends one JSON object per line to metrics.jsonl (flushed each time, so it can be tailed)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
