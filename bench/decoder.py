"""Greedy decoding speed at batch 1: our torch GPT with cache, HF `generate` on the same weights, the
exported decoder graph driven step by step in numpy with its cache, and the same graph without cache
(full recompute of the whole sequence every step); plus single-step time against past length.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from modelpkg import past_names, present_names

from .config import DecoderConfig
from .material import Checkpoint, Package, export_package, lm_checkpoint, passages, shared_dir
from .ortprofile import profile_callable, session
from .stats import Summary, ratio

log = logging.getLogger(__name__)


class OrtDecoder:
    """Greedy decoding on the package's generate graph (docs/model-package.md signature)."""

    def __init__(self, path: Path, cache: dict[str, int], threads: int) -> None:
        self.sess = session(path, threads)
        self.layers, self.heads, self.head_dim = cache["num_layers"], cache["num_heads"], cache["head_dim"]
        self.present_names = present_names(self.layers)
        self.past_names = past_names(self.layers)

    def empty_past(self, length: int = 0, rng: np.random.Generator | None = None) -> list[np.ndarray]:
        shape = (1, self.heads, length, self.head_dim)
        if rng is None:
            return [np.zeros(shape, np.float32) for _ in self.past_names]
        return [rng.standard_normal(shape, dtype=np.float32) for _ in self.past_names]

    def step(self, ids: np.ndarray, past: list[np.ndarray], with_presents: bool = True
             ) -> tuple[np.ndarray, list[np.ndarray]]:
        p = past[0].shape[2]
        s = ids.shape[1]
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, p + s), np.int64),
                 "position_ids": np.arange(p, p + s, dtype=np.int64)[None, :]}
        feeds.update(zip(self.past_names, past))
        names = ["logits", *self.present_names] if with_presents else ["logits"]
        out = self.sess.run(names, feeds)
        return out[0], out[1:]

    def generate_cached(self, prompt: np.ndarray, new_tokens: int) -> list[int]:
        logits, past = self.step(prompt, self.empty_past())
        out: list[int] = []
        for i in range(new_tokens):
            nxt = int(logits[0, -1].argmax())
            out.append(nxt)
            if i == new_tokens - 1:
                break
            logits, past = self.step(np.array([[nxt]], np.int64), past)
        return out

    def generate_uncached(self, prompt: np.ndarray, new_tokens: int) -> list[int]:
        """Past length 0 and the whole sequence every step; only the logits are fetched."""
        seq = prompt
        empty = self.empty_past()
        out: list[int] = []
        for _ in range(new_tokens):
            logits, _ = self.step(seq, empty, with_presents=False)
            nxt = int(logits[0, -1].argmax())
            out.append(nxt)
            seq = np.concatenate([seq, np.array([[nxt]], np.int64)], axis=1)
        return out


def _hf_generate(ckpt: Checkpoint) -> Callable[[np.ndarray, int], list[int]]:
    import torch
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(str(ckpt.path)).eval()

    def generate(prompt: np.ndarray, new_tokens: int) -> list[int]:
        ids = torch.from_numpy(prompt)
        with torch.inference_mode():
            # min_new_tokens = max_new_tokens: exactly new_tokens steps, like the other backends.
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, num_beams=1,
                                 pad_token_id=ckpt.config.get("eos_token_id") or 0)
        return out[0, prompt.shape[1]:].tolist()

    generate.attn_implementation = getattr(model.config, "_attn_implementation", None)  # type: ignore[attr-defined]
    return generate


def _torch_generate(ckpt: Checkpoint) -> Callable[[np.ndarray, int], list[int]]:
    import torch

    from training.checkpoint import load_model
    from training.gpt import generate_greedy

    model, _ = load_model(ckpt.path, kind="gpt")

    def generate(prompt: np.ndarray, new_tokens: int) -> list[int]:
        return generate_greedy(model, torch.from_numpy(prompt), None, new_tokens)[0].tolist()

    generate.model = model  # type: ignore[attr-defined]
    return generate


def agreement(a: list[int], b: list[int]) -> dict[str, Any]:
    """Whether two greedy outputs match, and where they first differ (near-ties may flip late tokens)."""
    n = min(len(a), len(b))
    first = next((i for i in range(n) if a[i] != b[i]), None)
    return {"identical": a == b, "first_difference": first}


def prompt_ids(pkg: Package, n: int) -> np.ndarray:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(pkg.path / "tokenizer.json"))
    ids = tok.encode(passages(1, min_words=4 * n, seed=3)[0]).ids[:n]
    if len(ids) < n:
        raise RuntimeError(f"prompt: only {len(ids)} tokens, need {n}")
    return np.array([ids], dtype=np.int64)


def step_times(ort_dec: OrtDecoder, torch_model: Any, cfg: DecoderConfig) -> dict[str, Any]:
    """Median single-step time (1 new token) at each past length, cached ORT and torch, and the
    ORT graph's full recompute of the same past+1 tokens for contrast; interleaved per repeat."""
    import torch

    rng = np.random.default_rng(0)
    rows = []
    for p in cfg.past_lengths:
        past = ort_dec.empty_past(p, rng)
        t_past = [(torch.from_numpy(past[2 * i]), torch.from_numpy(past[2 * i + 1])) for i in range(ort_dec.layers)]
        one = np.array([[7]], np.int64)
        full = np.full((1, p + 1), 7, np.int64)
        empty = ort_dec.empty_past()
        t_ids, t_mask = torch.tensor([[7]]), torch.ones(1, p + 1, dtype=torch.long)
        t_pos = torch.tensor([[p]])

        def t_step() -> None:
            with torch.inference_mode():
                torch_model(t_ids, t_mask, t_pos, past_key_values=t_past)

        fns = {"ort_cached": lambda: ort_dec.step(one, past),
               "torch_cached": t_step,
               "ort_uncached": lambda: ort_dec.step(full, empty, with_presents=False)}
        samples: dict[str, list[float]] = {k: [] for k in fns}
        for fn in fns.values():
            fn()
        for _ in range(cfg.step_repeats):
            for k, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                samples[k].append(time.perf_counter() - t0)
        rows.append({"past": p, **{k: Summary.of(v).scaled(1e3).as_json() for k, v in samples.items()}})
        log.info("decoder step past %d: %s", p, ", ".join(f"{k} {rows[-1][k]['median']:.2f} ms" for k in fns))
    return {"unit": "ms", "rows": rows}


def batch_step_times(ort_dec: OrtDecoder, cfg: DecoderConfig, past: int = 64) -> dict[str, Any]:
    """One cached step for B sequences at once (what continuous batching runs): how step time grows with
    B bounds how far aggregate tokens/s can scale with concurrent streams."""
    rng = np.random.default_rng(2)
    fns = {}
    for b in cfg.batch_sizes:
        shape = (b, ort_dec.heads, past, ort_dec.head_dim)
        feeds = {"input_ids": np.full((b, 1), 7, np.int64), "attention_mask": np.ones((b, past + 1), np.int64),
                 "position_ids": np.full((b, 1), past, np.int64),
                 **{n: rng.standard_normal(shape, dtype=np.float32) for n in ort_dec.past_names}}
        fns[b] = (lambda f=feeds: ort_dec.sess.run(None, f))
    samples: dict[int, list[float]] = {b: [] for b in fns}
    for fn in fns.values():
        fn()
    for _ in range(cfg.step_repeats):
        for b, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[b].append(time.perf_counter() - t0)
    rows = {str(b): Summary.of(v).scaled(1e3).as_json() for b, v in samples.items()}
    first, last = min(samples), max(samples)
    growth = ratio(Summary.from_json(rows[str(last)]), Summary.from_json(rows[str(first)]))
    return {"past": past, "step_ms": rows, "step_growth_last_vs_first": growth,
            "max_stream_scaling": {"median": last / first / growth["median"]}}


def run(cfg: DecoderConfig, work: Path) -> dict[str, Any]:
    import torch

    torch.set_num_threads(cfg.threads)
    need = max(cfg.prompt_tokens + cfg.new_tokens, max(cfg.past_lengths) + 1)
    ckpt, notes = lm_checkpoint(shared_dir(work), min_positions=need, default=cfg.sources.lm)
    pkg = export_package(ckpt, "generate", work / "repository", ("fp32",), threads=cfg.threads)
    notes += pkg.notes
    prompt = prompt_ids(pkg, cfg.prompt_tokens)
    ort_dec = OrtDecoder(pkg.variant_file("fp32"), pkg.manifest["cache"], cfg.threads)
    torch_gen = _torch_generate(ckpt)
    hf_gen = _hf_generate(ckpt)
    backends: dict[str, Callable[[np.ndarray, int], list[int]]] = {
        "torch_cached": torch_gen, "hf_generate": hf_gen,
        "ort_cached": ort_dec.generate_cached, "ort_uncached": ort_dec.generate_uncached}
    outputs: dict[str, list[int]] = {}
    seconds: dict[str, list[float]] = {k: [] for k in backends}
    for k, fn in backends.items():  # warm-up (a short generation), untimed
        fn(prompt, 4)
    for r in range(cfg.repeats):
        for k, fn in backends.items():
            if k == "ort_uncached" and r >= cfg.uncached_repeats:
                continue
            t0 = time.perf_counter()
            outputs[k] = fn(prompt, cfg.new_tokens)
            seconds[k].append(time.perf_counter() - t0)
            log.info("decoder %s: %d tokens in %.2f s", k, len(outputs[k]), seconds[k][-1])
    tps = {k: Summary.of(v).inverse(cfg.new_tokens) for k, v in seconds.items()}
    ratios = {"ort_cached_vs_uncached": ratio(tps["ort_cached"], tps["ort_uncached"]),
              "ort_cached_vs_hf_generate": ratio(tps["ort_cached"], tps["hf_generate"]),
              "ort_cached_vs_torch_cached": ratio(tps["ort_cached"], tps["torch_cached"]),
              "torch_cached_vs_hf_generate": ratio(tps["torch_cached"], tps["hf_generate"])}
    steps = step_times(ort_dec, torch_gen.model, cfg)  # type: ignore[attr-defined]
    batched = batch_step_times(ort_dec, cfg)
    log.info("decoder batched step at past %d: %s", batched["past"],
             ", ".join(f"b{b} {s['median']:.2f} ms" for b, s in batched["step_ms"].items()))
    first, last = steps["rows"][0], steps["rows"][-1]
    ratios["ort_step_past_last_vs_first"] = ratio(Summary.from_json(last["ort_cached"]),
                                                  Summary.from_json(first["ort_cached"]))
    ratios["torch_step_past_last_vs_first"] = ratio(Summary.from_json(last["torch_cached"]),
                                                    Summary.from_json(first["torch_cached"]))
    profiles = {}
    rng = np.random.default_rng(1)
    for p in (cfg.past_lengths[0], cfg.past_lengths[-1]):
        past = ort_dec.empty_past(p, rng)

        def body(sess: Any, past: list[np.ndarray] = past, p: int = p) -> None:
            feeds = {"input_ids": np.array([[7]], np.int64), "attention_mask": np.ones((1, p + 1), np.int64),
                     "position_ids": np.array([[p]], np.int64), **dict(zip(ort_dec.past_names, past))}
            for _ in range(6):
                sess.run(None, feeds)

        profiles[f"step_past_{p}"] = profile_callable(pkg.variant_file("fp32"), cfg.threads, work / "profiles", body)
    ref = outputs["ort_cached"]
    return {
        "piece": "decoder", "threads": cfg.threads, "new_tokens": cfg.new_tokens, "prompt_tokens": cfg.prompt_tokens,
        "checkpoint": ckpt.describe(),
        "shape": {k: ckpt.config.get(k) for k in ("n_layer", "n_embd", "n_head", "n_positions", "vocab_size")},
        "notes": notes,
        "hf_attention": getattr(hf_gen, "attn_implementation", None),
        "tokens_per_s": {k: s.as_json() for k, s in tps.items()},
        "ratios": ratios,
        "greedy_agreement_vs_ort_cached": {k: agreement(ref, v) for k, v in outputs.items() if k != "ort_cached"},
        "step_time": steps,
        "batched_step": batched,
        "ort_profiles": profiles,
    }
