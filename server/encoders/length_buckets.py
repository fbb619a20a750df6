"""An encoder batch run in groups of similar length instead of padded to its longest row.

The batcher pads every row of a batch to the longest one, and an encoder's cost grows with rows x width, so a
batch of short and long texts spends much of its run on padding (Shakespeare passages of 12 and 40 words: a
third of the token-rows). Here the rows are sorted by length (the attention mask's ones) and cut into runs, each
trimmed to its own longest row, where that costs less: a run's cost is modelled as rows x width token-rows
plus a fixed cost per run (RUN_OVERHEAD_TOKENS), and the cut minimising the sum is found exactly (rows are few:
O(n^2) over at most max_batch_size rows). Outputs come back in the batch's row order; those with a sequence axis
padded with zeros to the batch's width, as one run would have given them (positions past a row's length carry
no meaning either way).

Only right-padded rows are regrouped (every mask a run of ones then zeros, as the server's own encoding gives);
anything else runs as one batch.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

Feeds = dict[str, np.ndarray]

# A run's fixed cost in token-rows: a run's time split into a part per run and a part per token-row, measured on an
# encoder (bench/FINDINGS.md, "Length buckets").
RUN_OVERHEAD_TOKENS = 64


def plan(lengths: Sequence[int], overhead: int = RUN_OVERHEAD_TOKENS) -> list[list[int]]:
    """Row indices in runs: stretches of the rows sorted by length, minimising sum(rows * longest + overhead)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    sorted_lengths = [int(lengths[i]) for i in order]
    n = len(order)
    best = [0] + [float("inf")] * n        # best[j]: cheapest cut of the j shortest rows
    start = [0] * (n + 1)
    for j in range(1, n + 1):
        longest = sorted_lengths[j - 1]
        for i in range(j):
            cost = best[i] + (j - i) * longest + overhead
            if cost < best[j]:
                best[j], start[j] = cost, i
    runs, j = [], n
    while j > 0:
        runs.append(order[start[j]:j])
        j = start[j]
    return runs[::-1]


class LengthBucketedRun:
    """Wraps a batch runner (feeds -> outputs): the same answers, runs grouped by length."""

    def __init__(self, run: Callable[[Feeds], Feeds], sequence_inputs: Sequence[str],
                 sequence_outputs: Sequence[str], overhead: int = RUN_OVERHEAD_TOKENS) -> None:
        self._run = run
        self._sequence_inputs = set(sequence_inputs)
        self._sequence_outputs = set(sequence_outputs)
        self._overhead = overhead

    def __call__(self, feeds: Feeds) -> Feeds:
        mask = feeds.get("attention_mask")
        if mask is None or mask.ndim != 2 or mask.shape[0] < 2:
            return self._run(feeds)
        lengths = mask.sum(axis=1)
        width = mask.shape[1]
        if not np.array_equal(mask != 0, np.arange(width)[None, :] < lengths[:, None]):
            return self._run(feeds)        # not right-padded: trimming columns could cut real tokens
        runs = plan(lengths.tolist(), self._overhead)
        if len(runs) == 1:
            return self._run(feeds)
        pieces = []
        for rows in runs:
            index = np.asarray(rows)
            w = max(1, int(lengths[index].max()))
            sub = {k: (v[index, :w] if k in self._sequence_inputs else v[index]) for k, v in feeds.items()}
            pieces.append((index, self._run(sub)))
        batch = mask.shape[0]
        out: Feeds = {}
        for name, first in pieces[0][1].items():
            padded = name in self._sequence_outputs and first.ndim >= 2
            shape = (batch, width, *first.shape[2:]) if padded else (batch, *first.shape[1:])
            merged = np.zeros(shape, dtype=first.dtype)
            for index, result in pieces:
                value = result[name]
                if padded:
                    merged[index, :value.shape[1]] = value
                else:
                    merged[index] = value
            out[name] = merged
        return out
