"""Matmul FLOP counts (2·M·N·K per matmul) and the numpy sgemm reference rate.

Only matrix products are counted (every Linear and the two attention matmuls per layer): softmax,
LayerNorm, GELU and embedding look-ups are left out, as is usual for achieved-GFLOP/s figures.
"""
from __future__ import annotations

import time

import numpy as np

from .stats import Summary


def bert_classifier_flops(layers: int, hidden: int, intermediate: int, num_labels: int, batch: int,
                          seq: int) -> int:
    """One forward of BertForSequenceClassification at [batch, seq]."""
    tokens = batch * seq
    per_layer = (2 * tokens * hidden * hidden * 4           # query, key, value, attention output
                 + 2 * tokens * hidden * intermediate * 2   # FFN in and out
                 + 2 * batch * seq * seq * hidden * 2)      # Q·Kᵀ and P·V over all heads
    pooler = 2 * batch * hidden * hidden
    head = 2 * batch * hidden * num_labels
    return layers * per_layer + pooler + head


def sgemm_call(n: int):
    """A callable doing one float32 n×n×n matmul (to interleave with other timings), and its FLOPs."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty((n, n), dtype=np.float32)
    return (lambda: np.matmul(a, b, out=out)), 2.0 * n ** 3


def sgemm_rate(n: int, repeats: int, warmup: int = 2) -> Summary:
    """GFLOP/s of a float32 n×n×n numpy matmul (BLAS threads as configured for this process)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty((n, n), dtype=np.float32)
    for _ in range(warmup):
        np.matmul(a, b, out=out)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.matmul(a, b, out=out)
        times.append(time.perf_counter() - t0)
    return Summary.of(times).inverse(2.0 * n ** 3 / 1e9)
