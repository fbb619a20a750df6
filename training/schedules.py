"""Learning-rate schedules: warm-up then linear / cosine decay, or inverse square root."""
from __future__ import annotations

import math
from typing import Callable, Literal

import torch
from torch.optim.lr_scheduler import LambdaLR

ScheduleKind = Literal["linear", "cosine", "inverse_sqrt", "constant"]
SCHEDULES = ("linear", "cosine", "inverse_sqrt", "constant")


def lr_multiplier(kind: str, warmup: int, total: int) -> Callable[[int], float]:
    """The factor applied to the peak learning rate at each step (0-based)."""
    if kind not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {', '.join(SCHEDULES)}, got {kind!r}")
    warmup = max(0, warmup)

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if kind == "constant":
            return 1.0
        if kind == "inverse_sqrt":
            # "Attention is all you need": peak at the end of warm-up, then ~ 1/sqrt(step).
            return math.sqrt(max(warmup, 1) / (step + 1))
        progress = (step - warmup) / max(1, total - warmup)
        progress = min(1.0, progress)
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


def make_scheduler(optimizer: torch.optim.Optimizer, kind: str, warmup: int, total: int) -> LambdaLR:
    return LambdaLR(optimizer, lr_multiplier(kind, warmup, total))
