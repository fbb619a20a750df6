"""Reference: greedy generation of ONE sequence on the decoder graph, no batching, no padding.

The engine's continuous batching must give the same ids as this loop (tests compare them). Kept
deliberately plain and independent of the engine's cache and runner code.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnxruntime as ort


def greedy_generate(session: ort.InferenceSession, manifest: dict[str, Any], prompt_ids: Sequence[int],
                    max_new_tokens: int, stop_at_eos: bool = True) -> list[int]:
    """Generated ids (the eos id included when generation ended on it)."""
    cache = manifest["cache"]
    layers, heads, head_dim = cache["num_layers"], cache["num_heads"], cache["head_dim"]
    eos = (manifest.get("special_tokens") or {}).get("eos")
    if not prompt_ids:
        raise ValueError("prompt_ids: must not be empty")
    names = [f"{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    past = {f"past_key_values.{n}": np.zeros((1, heads, 0, head_dim), dtype=np.float32) for n in names}
    ids = np.asarray([prompt_ids], dtype=np.int64)
    positions = np.arange(len(prompt_ids), dtype=np.int64)[None, :]
    out: list[int] = []
    for _ in range(max_new_tokens):
        total = len(prompt_ids) + len(out)
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, total), dtype=np.int64),
                 "position_ids": positions, **past}
        results = session.run(["logits", *(f"present.{n}" for n in names)], feeds)
        token = int(np.argmax(results[0][0, -1]))
        out.append(token)
        if stop_at_eos and token == eos:
            break
        past = {f"past_key_values.{n}": arr for n, arr in zip(names, results[1:])}
        ids = np.asarray([[token]], dtype=np.int64)
        positions = np.asarray([[total]], dtype=np.int64)
    return out
