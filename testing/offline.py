"""Reference: greedy generation of ONE sequence on a decoder graph, no batching, no padding (a concat-layout
graph: greedy_generate; an in-place one, any variant: greedy_inplace).

The engine's continuous batching must give the same ids as these loops (tests compare them). Kept
deliberately plain and independent of the engine's cache and runner code.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnxruntime as ort

from modelpkg import CACHE_ELEMENT_TYPES, CacheSpec, past_names, present_names


def greedy_generate(session: ort.InferenceSession, manifest: dict[str, Any], prompt_ids: Sequence[int],
                    max_new_tokens: int, stop_at_eos: bool = True) -> list[int]:
    """Generated ids (the eos id included when generation ended on it)."""
    return [t for t, _ in greedy_with_logprobs(session, manifest, prompt_ids, max_new_tokens, stop_at_eos)]


def greedy_with_logprobs(session: ort.InferenceSession, manifest: dict[str, Any], prompt_ids: Sequence[int],
                         max_new_tokens: int, stop_at_eos: bool = True) -> list[tuple[int, float]]:
    """greedy_generate's ids, each with its log-probability under the model (float64 log-softmax)."""
    cache = CacheSpec.from_dict(manifest["cache"])
    eos = (manifest.get("special_tokens") or {}).get("eos")
    if not prompt_ids:
        raise ValueError("prompt_ids: must not be empty")
    inputs, outputs = past_names(cache.num_layers), present_names(cache.num_layers)
    past = {n: np.zeros((1, cache.kv_heads, 0, cache.head_dim), dtype=_past_dtype(session)) for n in inputs}
    ids = np.asarray([prompt_ids], dtype=np.int64)
    positions = np.arange(len(prompt_ids), dtype=np.int64)[None, :]
    takes_positions = "position_ids" in {i.name for i in session.get_inputs()}
    out: list[tuple[int, float]] = []
    for _ in range(max_new_tokens):
        total = len(prompt_ids) + len(out)
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, total), dtype=np.int64), **past}
        if takes_positions:   # learned positions (GPT-2); rotary graphs derive them from the mask
            feeds["position_ids"] = positions
        results = session.run(["logits", *outputs], feeds)
        row = results[0][0, -1].astype(np.float64)
        token = int(np.argmax(row))
        out.append((token, float(row[token] - row.max() - np.log(np.exp(row - row.max()).sum()))))
        if stop_at_eos and token == eos:
            break
        past = dict(zip(inputs, results[1:]))
        ids = np.asarray([[token]], dtype=np.int64)
        positions = np.asarray([[total]], dtype=np.int64)
    return out


def prompt_distributions(session: ort.InferenceSession, manifest: dict[str, Any], prompt_ids: Sequence[int]
                         ) -> np.ndarray:
    """Log-softmax rows [len - 1, vocab] from ONE run over the whole prompt: row i is the model's distribution
    for prompt token i + 1 (the first token has no context)."""
    cache = CacheSpec.from_dict(manifest["cache"])
    n = len(prompt_ids)
    feeds = {"input_ids": np.asarray([prompt_ids], dtype=np.int64), "attention_mask": np.ones((1, n), dtype=np.int64),
             **{name: np.zeros((1, cache.kv_heads, 0, cache.head_dim), dtype=_past_dtype(session))
                for name in past_names(cache.num_layers)}}
    if "position_ids" in {i.name for i in session.get_inputs()}:
        feeds["position_ids"] = np.arange(n, dtype=np.int64)[None, :]
    rows = session.run(["logits"], feeds)[0][0, :-1].astype(np.float64)
    rows -= rows.max(axis=1, keepdims=True)
    rows -= np.log(np.exp(rows).sum(axis=1, keepdims=True))
    return rows


def prompt_logprobs(session: ort.InferenceSession, manifest: dict[str, Any], prompt_ids: Sequence[int]
                    ) -> tuple[list[float], list[int]]:
    """Each prompt token's log-probability given the ones before it (len - 1 values), and the likeliest token at
    each of those positions."""
    rows = prompt_distributions(session, manifest, prompt_ids)
    return ([float(rows[i, t]) for i, t in enumerate(prompt_ids[1:])], [int(i) for i in rows.argmax(axis=1)])


def _past_dtype(session: ort.InferenceSession) -> type:
    """The graph's cache element type (float32; float16 for an fp16 graph)."""
    past = next(i for i in session.get_inputs() if i.name.startswith("past_key_values."))
    return CACHE_ELEMENT_TYPES[past.type]


def greedy_inplace(session: ort.InferenceSession, manifest: dict[str, Any], prompt_ids: Sequence[int],
                   max_new_tokens: int, stop_at_eos: bool = True,
                   step_logits: list[np.ndarray] | None = None, forced: Sequence[int] | None = None) -> list[int]:
    """greedy_generate for an in-place-cache graph (model.json cache.layout "inplace", any variant: its cache
    element type is read from the graph): one buffer per layer and kind of max_length positions, bound as both
    past and present; the prompt in one run, then one token per run. `step_logits`, when given, receives each
    step's last-position logits; `forced` tokens are fed instead of the argmax (teacher forcing: step_logits then
    scores another engine's answer)."""
    cache = CacheSpec.from_dict(manifest["cache"])
    eos = (manifest.get("special_tokens") or {}).get("eos")
    if not prompt_ids:
        raise ValueError("prompt_ids: must not be empty")
    types = {i.name: i.type for i in session.get_inputs()}
    pasts, presents = past_names(cache.num_layers), present_names(cache.num_layers)
    shape = (1, cache.kv_heads, manifest["max_length"], cache.head_dim)
    buffers = [ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, CACHE_ELEMENT_TYPES[types[p]])) for p in pasts]
    ids, total, out = list(prompt_ids), len(prompt_ids), []
    while len(out) < max_new_tokens:
        io = session.io_binding()
        for past, present, buf in zip(pasts, presents, buffers):
            io.bind_ortvalue_input(past, buf)
            io.bind_ortvalue_output(present, buf)
        io.bind_cpu_input("input_ids", np.asarray([ids], dtype=np.int64))
        io.bind_cpu_input("attention_mask", np.ones((1, total), dtype=np.int64))
        if "position_ids" in types:
            io.bind_cpu_input("position_ids", np.arange(total - len(ids), total, dtype=np.int64)[None, :])
        io.bind_output("logits")
        session.run_with_iobinding(io)
        last = io.get_outputs()[-1].numpy()[0, -1]
        if step_logits is not None:
            step_logits.append(last.astype(np.float32))
        token = int(forced[len(out)]) if forced is not None else int(np.argmax(last))
        out.append(token)
        if stop_at_eos and token == eos or forced is not None and len(out) == len(forced):
            break
        ids, total = [token], total + 1
    return out
