"""Decode-step time of an encoder-decoder package's variants, measured where it is exported, to pick the CPU default
(export/speed.py does the same for decoders and owns the rules: the variants interleaved round by round, the
median of round medians, a less exact variant chosen only when more than speed.MARGIN faster).

One step = one new token per row over a self cache of `past` positions and cross keys/values of `source`
positions, both bound through IOBinding as the server binds them, at batch 1 and 8. The encoder runs once per
request and is not timed here: a request spends most of its time in decode steps, one per new token against one
encoder call (the OPUS-MT shape's step and encoder times: docs/BENCHMARKS.md, "Weight-quantized encoder-decoders").
"""
from __future__ import annotations

import logging
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from modelpkg import Manifest, past_names, present_names

from .speed import AUTO_DEFAULT, MARGIN, cpu_threads, interleaved, pick_fastest, session

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Seq2SeqSpeedConfig:
    batches: tuple[int, ...] = (1, 8)
    past: int = 16           # target positions already cached (capped below max_target_length)
    source: int = 24         # source positions of the cross keys/values (capped at max_source_length)
    rounds: int = 5
    steps: int = 12
    spinning: bool = False   # the server's default


class Seq2SeqStepper:
    """One decoder step bound once through IOBinding: the self cache in place (past and present the same buffers),
    random cross keys/values of `source` positions, `past` cached target tokens (`at` moves it)."""

    def __init__(self, sess: ort.InferenceSession, spec, batch: int, past: int, source: int) -> None:
        self.sess, self.batch = sess, batch
        rng = np.random.default_rng(0)
        shape = (batch, spec.num_heads, spec.max_target_length, spec.head_dim)
        self.io = sess.io_binding()
        self._bufs = []
        for p, q in zip(past_names(spec.num_layers), present_names(spec.num_layers)):
            buf = ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32))
            self._bufs.append(buf)
            self.io.bind_ortvalue_input(p, buf)
            self.io.bind_ortvalue_output(q, buf)
        for name in spec.cross_names:
            self.io.bind_cpu_input(name, rng.standard_normal((batch, spec.num_heads, source, spec.head_dim))
                                   .astype(np.float32))
        self.io.bind_cpu_input("encoder_attention_mask", np.ones((batch, source), np.int64))
        self.io.bind_cpu_input("input_ids", np.full((batch, 1), spec.eos_token_id, np.int64))
        self.io.bind_output("logits")
        self.at(past)

    def at(self, past: int) -> None:
        """The next step writes target position `past` (reads `past` cached tokens)."""
        self.io.bind_cpu_input("attention_mask", np.ones((self.batch, past + 1), np.int64))

    def step(self) -> None:
        self.sess.run_with_iobinding(self.io)


def measure(package: Path, manifest: Manifest, variants: list[str], cfg: Seq2SeqSpeedConfig = Seq2SeqSpeedConfig(),
            threads: int | None = None) -> dict[str, dict[str, float]]:
    """variant -> {"b1": ms, "b8": ms}: the decoder graph's step of each variant."""
    spec = manifest.encoder_decoder
    assert spec is not None
    threads = threads or cpu_threads()
    past, source = min(cfg.past, spec.max_target_length - 1), min(cfg.source, spec.max_source_length)
    sessions = {v: session(package / spec.decoder_file(v), threads, cfg.spinning) for v in variants}
    out: dict[str, dict[str, float]] = {v: {} for v in variants}
    for batch in cfg.batches:
        steppers = {v: Seq2SeqStepper(s, spec, batch, past, source) for v, s in sessions.items()}
        for v, rounds in interleaved(steppers, cfg.rounds, cfg.steps).items():
            out[v][f"b{batch}"] = round(statistics.median(rounds), 4)
    log.info("encoder-decoder step ms (past %d, source %d, %d threads): %s", past, source, threads,
             ", ".join(f"{v} {t}" for v, t in out.items()))
    return out


def record(staging: Path, manifest: Manifest, report: dict, cfg: Seq2SeqSpeedConfig = Seq2SeqSpeedConfig()) -> None:
    """Time the published variants when there is a choice, into parity.json (`step_ms` per variant, `speed`);
    package.default_variants picks the CPU default from them."""
    passed = [v for v in manifest.variants if v in AUTO_DEFAULT and report["variants"].get(v, {}).get("passed")]
    if len(passed) < 2:
        return
    spec = manifest.encoder_decoder
    assert spec is not None
    threads = cpu_threads()
    load = os.getloadavg()
    times = measure(staging, manifest, passed, cfg, threads)
    for v, t in times.items():
        report["variants"][v]["step_ms"] = t
    report["speed"] = {"what": "one decoder step, one new token per row, self cache and cross keys/values bound "
                               "through IOBinding (the encoder, once per request, not timed)",
                       "past": min(cfg.past, spec.max_target_length - 1),
                       "source": min(cfg.source, spec.max_source_length), "threads": threads,
                       "spinning": cfg.spinning, "rounds": cfg.rounds, "steps_per_round": cfg.steps,
                       "loadavg_before": [round(x, 2) for x in load],
                       "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                       "fastest": pick_fastest(times), "margin": MARGIN}
