"""onnxruntime calls of the KV-cache decoder: batched prefill (past length 0) and one-token steps.

Synchronous on purpose: the engine runs these in its own thread (onnxruntime releases the GIL).
Only the last position's logits are returned.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort

from .kvcache import BatchCache
from .spec import DecoderSpec


class DecoderRunner:
    def __init__(self, session: ort.InferenceSession, spec: DecoderSpec) -> None:
        self.session = session
        self.spec = spec
        self._outputs = ["logits", *spec.present_names]

    def prefill(self, prompts: list[list[int]]) -> tuple[np.ndarray, BatchCache]:
        """Left-padded batch of prompts → (last logits [B, V], cache of the prompts)."""
        spec = self.spec
        width = max(len(p) for p in prompts)
        ids = np.full((len(prompts), width), spec.pad_id, dtype=np.int64)
        mask = np.zeros((len(prompts), width), dtype=np.int64)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt):] = prompt
            mask[row, width - len(prompt):] = 1
        positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
        past = BatchCache.empty(spec.num_layers, len(prompts), spec.num_heads, spec.head_dim)
        feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions,
                 **{k: a.astype(spec.past_dtype, copy=False) for k, a in past.feeds().items()}}
        logits, cache = self._run(feeds, mask)
        # A padding query row attends to nothing; some graphs leave NaN in its keys/values, and a
        # NaN times a zero attention weight is still NaN later. Zero those columns.
        pad = mask == 0
        if pad.any():
            for arr in (*cache.keys, *cache.values):
                arr.transpose(0, 2, 1, 3)[pad] = 0   # [B, S, H, D] view indexed by the [B, S] mask
        return logits, cache

    def step(self, cache: BatchCache, tokens: np.ndarray) -> tuple[np.ndarray, BatchCache]:
        """Feed one token per row → (last logits [B, V], cache grown by one column)."""
        batch = cache.batch
        mask = np.concatenate([cache.mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
        # Next position = number of real tokens so far (the mask's count before this one).
        positions = cache.mask.sum(axis=1, dtype=np.int64).reshape(batch, 1)
        feeds = {"input_ids": tokens.astype(np.int64).reshape(batch, 1), "attention_mask": mask,
                 "position_ids": positions, **cache.feeds()}
        return self._run(feeds, mask)

    def _run(self, feeds: dict[str, np.ndarray], mask: np.ndarray) -> tuple[np.ndarray, BatchCache]:
        out = self.session.run(self._outputs, feeds)
        logits = np.ascontiguousarray(out[0][:, -1, :], dtype=np.float32)
        presents = out[1:]
        for name, arr in zip(self.spec.present_names, presents):
            if arr.shape[0] != mask.shape[0] or arr.shape[2] != mask.shape[1]:
                raise RuntimeError(f"model graph: output {name!r} has shape {arr.shape}, expected "
                                   f"[{mask.shape[0]}, heads, {mask.shape[1]}, head_dim]")
        return logits, BatchCache(list(presents[0::2]), list(presents[1::2]), mask)
