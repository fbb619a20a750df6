"""Repeat-and-summarise helpers: every figure is a median over repeats with its min and max."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from testing.closedloop import percentile

__all__ = ["Summary", "percentile", "ratio", "time_calls"]


@dataclass(frozen=True)
class Summary:
    """Median, min and max of repeated samples, in the unit the samples were taken in."""

    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> "Summary":
        if not samples:
            raise ValueError("samples: need at least one sample")
        return cls(float(statistics.median(samples)), float(min(samples)), float(max(samples)), len(samples))

    def scaled(self, factor: float) -> "Summary":
        """Same summary in another unit (factor > 0 keeps the order of min/max)."""
        return Summary(self.median * factor, self.min * factor, self.max * factor, self.n)

    def inverse(self, numerator: float) -> "Summary":
        """numerator / x, e.g. a time per item -> items per second (min and max swap)."""
        return Summary(numerator / self.median, numerator / self.max, numerator / self.min, self.n)

    def as_json(self) -> dict[str, float | int]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Summary":
        return cls(float(d["median"]), float(d["min"]), float(d["max"]), int(d["n"]))


def time_calls(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> list[float]:
    """Seconds per call of `fn`, `repeats` samples after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def ratio(numerator: Summary, denominator: Summary) -> dict[str, float]:
    """Ratio of two figures of the same run: of medians, and the extremes the ranges allow."""
    return {"median": numerator.median / denominator.median,
            "min": numerator.min / denominator.max,
            "max": numerator.max / denominator.min}
