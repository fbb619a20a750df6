"""What the parity gate records: a Check per comparison, a VariantResult per variant (parity.json's `variants`),
which quantized variants it refused, and the table the terminal shows."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .weights import WEIGHT_VARIANTS

# Quantized variants trade accuracy for speed: one the gate refuses leaves the package and the rest is published
# (fp32, optimized and fp16 must match the checkpoint, or nothing is).
REFUSED_ALONE = frozenset({"int8", *WEIGHT_VARIANTS})


@dataclass
class Check:
    name: str
    passed: bool
    max_abs_diff: float | None = None
    worst_output: str | None = None
    value: float | None = None      # agreement / accuracy checks
    threshold: float | None = None
    detail: str = ""
    upper: bool | None = None       # True: the value must stay at or below the threshold (else at or above)
    tolerance: dict[str, float] | None = None   # fp32: per output, the atol this check's noise gave (parity_noise.py)
    noise: dict[str, float] | None = None       # ... and that noise: |PyTorch fp32 - fp64| on the check's inputs

    def as_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None and v != ""}


@dataclass
class VariantResult:
    variant: str
    status: str  # "passed" | "failed" | "not run: <why>"
    tolerance: dict[str, float]
    checks: list[Check] = field(default_factory=list)
    max_abs_diff: dict[str, float] = field(default_factory=dict)  # per output, over the whole grid
    noise: Any = None   # fp32: the NoiseScale its checks judged by (export/parity_noise.py): noise and atols used

    @property
    def passed(self) -> bool | None:
        return None if self.status.startswith("not run") else self.status == "passed"

    def as_json(self) -> dict:
        out = {"passed": self.passed, "status": self.status, "tolerance": self.tolerance,
               "max_abs_diff": self.max_abs_diff, "checks": [c.as_json() for c in self.checks]}
        if self.noise is not None:
            out["float_noise"] = self.noise.as_json()
        return out


def refused(results: dict[str, VariantResult]) -> list[str]:
    """The quantized variants the gate refused: the package publishes without them."""
    return [v for v, r in results.items() if v in REFUSED_ALONE and r.passed is False]


def failure_table(results: dict[str, VariantResult], tokenizer: dict[str, Any] | None = None) -> str:
    """Max differences per output (and failed checks) of every variant, for the terminal."""
    rows = [f"{'variant':<10} {'output / check':<44} {'value':>12}  {'limit':<22} result"]
    for v, r in results.items():
        if r.passed is None:
            rows.append(f"{v:<10} {'-':<44} {'-':>12}  {'-':<22} {r.status}")
            continue
        if "atol" in r.tolerance:
            # A row is an output (the grid's) or a check (the in-place checks key their differences by name); its
            # atol the largest the noise rule gave that output or check, else the fixed one.
            atols = dict(r.noise.used) if r.noise is not None else {}
            atols.update({c.name: max(c.tolerance.values()) for c in r.checks if c.tolerance})
            bad = {c.worst_output for c in r.checks if not c.passed and c.worst_output} | \
                  {c.name for c in r.checks if not c.passed}
            for name, d in r.max_abs_diff.items():
                limit = f"atol {atols.get(name, r.tolerance['atol']):.2g} rtol {r.tolerance['rtol']:g}"
                rows.append(f"{v:<10} {name:<44} {d:>12.3e}  {limit:<22} {'FAIL' if name in bad else 'ok'}")
        for c in r.checks:
            if c.value is not None or not c.passed and not c.worst_output:
                val = f"{c.value:.4f}" if c.value is not None else "-"
                lim = f"{'<=' if c.upper else '>='} {c.threshold:.4f}" if c.threshold is not None else ""
                rows.append(f"{v:<10} {c.name[:44]:<44} {val:>12}  {lim:<22} {'ok' if c.passed else 'FAIL'}")
        for c in r.checks:
            if not c.passed and c.worst_output:
                rows.append(f"{v:<10}   failed: {c.name} ({c.worst_output} max_abs_diff {c.max_abs_diff:.3e})")
    if tokenizer is not None and not tokenizer.get("passed", True):
        for f in tokenizer.get("failures", [])[:10]:
            rows.append(f"{'tokenizer':<10} {f}")
    return "\n".join(rows)
