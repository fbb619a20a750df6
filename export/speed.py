"""Decode-step time of an in-place decoder's variants, measured where it is exported, to pick the CPU default.

One step = one new token per row, the cache bound in place through IOBinding (as the server binds it), at
batch 1 and batch 8. The variants are interleaved round by round so a change of load hits them alike, and each
figure is the median over rounds of the median step of a round.
"""
from __future__ import annotations

import logging
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from modelpkg import CACHE_ELEMENT_TYPES, Manifest, past_name, present_name

log = logging.getLogger(__name__)

# The variants the CPU default is picked from, most exact first: on a near tie the more exact one is kept. The
# int8-cache variants (kv8, w8kv8, w4kv8) are asked for by name: their prompt prefill is slower and served kv8 came
# out even with fp32 (docs/BENCHMARKS.md, the kv8 variant in "Generation vs peers: gpt2"), which a decode-step
# timing cannot see. int8 (an encoder-decoder's per-token integer variant) ranks after w8: its weight scales are
# per column where w8's are per block of 128 rows, and on the gate's held-out sources it kept about as many greedy
# outputs identical to fp32 as w8, a few more on some random models and fewer on others (docs/model-package.md,
# "Encoder-decoder packages").
AUTO_DEFAULT = ("fp32", "w8", "int8", "w4")
MARGIN = 0.05   # a less exact variant becomes the default only when at least 5% faster


@dataclass(frozen=True)
class SpeedConfig:
    batches: tuple[int, ...] = (1, 8)
    past: int = 128          # cached positions of every row (capped below max_length)
    rounds: int = 5
    steps: int = 12          # timed steps per round
    spinning: bool = False   # the server's default (--intra-op-spinning off)


def cpu_threads() -> int:
    return len(os.sched_getaffinity(0))


def session(path: Path | bytes, threads: int, spinning: bool, profile: str | None = None) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    if profile:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile
    return ort.InferenceSession(path if isinstance(path, bytes) else str(path), opts,
                                providers=["CPUExecutionProvider"])


class Stepper:
    """Decode steps of one graph on `batch` slots whose caches hold `past` positions (their contents do not
    change the time)."""

    def __init__(self, sess: ort.InferenceSession, num_layers: int, kv_heads: int, head_dim: int, max_length: int,
                 batch: int, past: int) -> None:
        self.sess = sess
        names = [(past_name(i, k), present_name(i, k)) for i in range(num_layers) for k in ("key", "value")]
        dtype = CACHE_ELEMENT_TYPES[{i.name: i.type for i in sess.get_inputs()}[names[0][0]]]
        shape = (batch, kv_heads, max_length, head_dim)
        self.bufs = [ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, dtype)) for _ in names]
        self.io = sess.io_binding()
        for (p, q), buf in zip(names, self.bufs):
            self.io.bind_ortvalue_input(p, buf)
            self.io.bind_ortvalue_output(q, buf)
        self.ids = np.ones((batch, 1), np.int64)
        self.mask = np.ones((batch, past + 1), np.int64)
        self.pos = np.full((batch, 1), past, np.int64)
        self.positions = "position_ids" in {i.name for i in sess.get_inputs()}

    def step(self) -> None:
        self.io.bind_cpu_input("input_ids", self.ids)
        self.io.bind_cpu_input("attention_mask", self.mask)
        if self.positions:
            self.io.bind_cpu_input("position_ids", self.pos)
        self.io.bind_output("logits")
        self.sess.run_with_iobinding(self.io)


def interleaved(steppers: dict[str, Stepper], rounds: int, steps: int) -> dict[str, list[float]]:
    """Per name, `rounds` medians (ms) of `steps` timed steps; the names take turns within each round."""
    out: dict[str, list[float]] = {name: [] for name in steppers}
    for s in steppers.values():
        for _ in range(3):
            s.step()
    for _ in range(rounds):
        for name, s in steppers.items():
            s.step()
            samples = []
            for _ in range(steps):
                t0 = time.perf_counter()
                s.step()
                samples.append((time.perf_counter() - t0) * 1e3)
            out[name].append(statistics.median(samples))
    return out


def measure(files: dict[str, Path], cache: dict, max_length: int, cfg: SpeedConfig = SpeedConfig(),
            threads: int | None = None) -> dict[str, dict[str, float]]:
    """variant -> {"b1": ms, "b8": ms} for the in-place graphs `files` (model.json `cache` sizes)."""
    threads = threads or cpu_threads()
    past = min(cfg.past, max_length - 1)
    sessions = {v: session(p, threads, cfg.spinning) for v, p in files.items()}
    kv = cache.get("num_kv_heads") or cache["num_heads"]
    out: dict[str, dict[str, float]] = {v: {} for v in files}
    for batch in cfg.batches:
        steppers = {v: Stepper(s, cache["num_layers"], kv, cache["head_dim"], max_length, batch, past)
                    for v, s in sessions.items()}
        for v, rounds in interleaved(steppers, cfg.rounds, cfg.steps).items():
            out[v][f"b{batch}"] = round(statistics.median(rounds), 4)
    log.info("decode step ms (past %d, %d threads): %s", past, threads,
             ", ".join(f"{v} {t}" for v, t in out.items()))
    return out


def score(times: dict[str, float]) -> float:
    """One figure per variant: the geometric mean of its step times over the measured batches."""
    return float(np.exp(np.mean(np.log(list(times.values())))))


def pick_fastest(times: dict[str, dict[str, float]]) -> str:
    """The fastest of the AUTO_DEFAULT variants timed, walking from the most exact: a less exact one wins only by
    more than MARGIN."""
    ranked = [v for v in AUTO_DEFAULT if v in times]
    best = ranked[0]
    for v in ranked[1:]:
        if score(times[v]) < score(times[best]) * (1 - MARGIN):
            best = v
    return best


def record(staging: Path, manifest: Manifest, report: dict, cfg: SpeedConfig = SpeedConfig()) -> None:
    """Time every published variant of an in-place decoder that has more than one, into parity.json: per variant
    `step_ms`, and the conditions under `speed` (package.default_variants picks the CPU default from them)."""
    cache = manifest.cache.to_dict() if manifest.cache is not None else {}
    files = {v: staging / f for v, f in manifest.variants.items() if report["variants"].get(v, {}).get("passed")}
    if cache.get("layout") != "inplace" or len(set(files) & set(AUTO_DEFAULT)) < 2:
        return   # nothing to choose between (the int8-cache variants are timed only beside a choice)
    threads = cpu_threads()
    load = os.getloadavg()
    times = measure(files, cache, manifest.max_length, cfg, threads)
    for v, t in times.items():
        report["variants"][v]["step_ms"] = t
    report["speed"] = {"what": "one decode step, one new token per row, cache bound in place (IOBinding)",
                       "past": min(cfg.past, manifest.max_length - 1), "threads": threads,
                       "spinning": cfg.spinning, "rounds": cfg.rounds, "steps_per_round": cfg.steps,
                       "loadavg_before": [round(x, 2) for x in load],
                       "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                       "fastest": pick_fastest(times), "margin": MARGIN}
