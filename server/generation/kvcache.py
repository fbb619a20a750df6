"""The running batch's KV cache: one [B, H, P, D] float32 array per layer and kind, plus the mask.

Rows are sequences (in the engine's active order); columns are past positions. Sequences of
different lengths share the P axis by left padding: a row's padding columns are 0 in `mask`, so the
graph ignores them. Positions come from position_ids, not from column indices, so padding columns
can be added or removed on the left without changing any sequence's result.
"""
from __future__ import annotations

import numpy as np

from modelpkg import past_name


class BatchCache:
    def __init__(self, keys: list[np.ndarray], values: list[np.ndarray], mask: np.ndarray) -> None:
        self.keys = keys       # per layer [B, H, P, D]
        self.values = values   # per layer [B, H, P, D]
        self.mask = mask       # [B, P] int64, 1 = real token

    @classmethod
    def empty(cls, num_layers: int, batch: int, heads: int, head_dim: int) -> "BatchCache":
        """Past of length 0: what a prefill run takes."""
        z = np.zeros((batch, heads, 0, head_dim), dtype=np.float32)
        return cls([z] * num_layers, [z] * num_layers, np.zeros((batch, 0), dtype=np.int64))

    @property
    def batch(self) -> int:
        return int(self.mask.shape[0])

    @property
    def length(self) -> int:
        return int(self.mask.shape[1])

    def feeds(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            out[past_name(i, "key")] = k
            out[past_name(i, "value")] = v
        return out

    def select(self, rows: list[int]) -> "BatchCache":
        """Keep only these rows (finished or cancelled sequences leave), then drop dead columns."""
        idx = np.asarray(rows, dtype=np.int64)
        return BatchCache([k[idx] for k in self.keys], [v[idx] for v in self.values], self.mask[idx]).trimmed()

    def trimmed(self) -> "BatchCache":
        """Drop leading columns that are padding in every row, so P does not grow without bound."""
        if self.length == 0 or self.batch == 0:
            return self
        live = np.flatnonzero(self.mask.any(axis=0))
        start = int(live[0]) if live.size else self.length
        if start == 0:
            return self
        return BatchCache([k[:, :, start:] for k in self.keys], [v[:, :, start:] for v in self.values],
                          self.mask[:, start:])

    def padded_to(self, length: int) -> "BatchCache":
        """Left-pad with masked zero columns up to `length`."""
        extra = length - self.length
        if extra <= 0:
            return self

        def pad(a: np.ndarray) -> np.ndarray:
            b, h, _, d = a.shape
            return np.concatenate([np.zeros((b, h, extra, d), dtype=a.dtype), a], axis=2)

        mask = np.concatenate([np.zeros((self.batch, extra), dtype=self.mask.dtype), self.mask], axis=1)
        return BatchCache([pad(k) for k in self.keys], [pad(v) for v in self.values], mask)

    @staticmethod
    def concat(first: "BatchCache | None", second: "BatchCache") -> "BatchCache":
        """Rows of `first` then rows of `second`, aligned on the right by left padding."""
        if first is None or first.batch == 0:
            return second
        n = max(first.length, second.length)
        a, b = first.padded_to(n), second.padded_to(n)
        return BatchCache([np.concatenate([x, y]) for x, y in zip(a.keys, b.keys)],
                          [np.concatenate([x, y]) for x, y in zip(a.values, b.values)],
                          np.concatenate([a.mask, b.mask]))
