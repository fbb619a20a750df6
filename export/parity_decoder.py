"""The in-place decoder's parity checks, run through export/parity_inplace.py's slot driver: fp32 (and its mixed
twin) against PyTorch; the int8 cache (kv8) and fp16 by what they change, teacher-forced KL and perplexity on
held-out text; the weight-quantized variants (w8, w4, w8kv8, w4kv8) by perplexity and greedy agreement."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .decoder_graph import FP16_MIXED_FILE, KV8_MIXED_FILE, MIXED_FILE
from .heldout import greedy_prompts, kv8_texts
from .parity_inplace import InplaceChecks
from .parity_inputs import GateInputs, pad_id, session, token_stream
from .parity_noise import NoiseScale, float64_twin
from .parity_results import Check, VariantResult
from .weights import variant_files

log = logging.getLogger(__name__)


class DecoderChecks:
    """One gate's decoder checks; the weight variants share one InplaceChecks (it keeps PyTorch's greedy
    references)."""

    def __init__(self, inp: GateInputs) -> None:
        self.inp = inp
        self._weight_checks: InplaceChecks | None = None

    def _checks(self, atol: float, rtol: float, greedy_new_tokens: int) -> InplaceChecks:
        inp = self.inp
        return InplaceChecks(inp.model, token_stream(inp), inp.num_layers, inp.num_kv_heads or inp.num_heads,
                             inp.head_dim, inp.max_length, pad_id(inp), atol, rtol, greedy_new_tokens)

    def _held_out_stream(self) -> np.ndarray:
        return np.array(self.inp.tokenizer.encode(kv8_texts(self.inp.texts)[1]).ids, dtype=np.int64)

    def exact(self, sess: ort.InferenceSession, path: Path, atol: float, rtol: float, res: VariantResult) -> None:
        """fp32 / optimized: every in-place check against PyTorch (fp32's mixed twin too)."""
        inp = self.inp
        checks = self._checks(atol, rtol, inp.grid.greedy_new_tokens)
        if res.variant == "fp32":    # its tolerance follows PyTorch's own float noise (export/parity_noise.py)
            checks.noise = NoiseScale(atol, rtol, inp.tolerances.fp32_noise_factor)
            checks.model64 = float64_twin(inp.model)
            res.noise = checks.noise
        mixed_path = path.parent / MIXED_FILE
        mixed = session(mixed_path, inp.threads) if res.variant == "fp32" and mixed_path.is_file() else None
        judged = iter(checks.judgements)
        for name, passed, diff, worst, detail in checks.run_all(sess, mixed):
            # the checks that compared values judged one _compare each, in order
            atols, noise = next(judged, (None, None)) if worst and checks.noise is not None else (None, None)
            res.checks.append(Check(name, passed, max_abs_diff=diff if worst else None, worst_output=worst or None,
                                    value=None if worst else float(passed), threshold=None if worst else 1.0,
                                    detail=detail, tolerance=atols or None, noise=noise or None))
            if worst:
                res.max_abs_diff[name] = diff
        log.info("parity %s (in-place cache): %s", res.variant,
                 ", ".join(f"{c.name}: {'ok' if c.passed else 'FAIL'}" for c in res.checks))

    def kv8(self, sess: ort.InferenceSession, path: Path, res: VariantResult) -> None:
        """The int8 cache: teacher-forced decoding on text its scales were not calibrated on."""
        t = self.inp.tolerances
        self.teacher_forced(sess, path.parent / KV8_MIXED_FILE, res, "kv8", "the int8 cache", t.kv8_max_kl,
                            t.kv8_max_perplexity_ratio, t.kv8_mixed_atol)

    def fp16(self, sess: ort.InferenceSession, path: Path, res: VariantResult) -> None:
        t = self.inp.tolerances
        self.teacher_forced(sess, path.parent / FP16_MIXED_FILE, res, "fp16", "the fp16 graph and cache",
                            t.fp16_max_kl, t.fp16_max_perplexity_ratio, t.fp16_mixed_atol)

    def teacher_forced(self, sess: ort.InferenceSession, mixed_path: Path, res: VariantResult, label: str,
                       what: str, max_kl: float, max_ratio: float, mixed_atol: float) -> None:
        """A variant of the in-place graph that is not fp32 throughout (an int8 cache, fp16): judged by what it
        changes — the next-token distributions (KL) and perplexity, teacher-forced on held-out text — and its
        mixed twin by equality with the plain graph on each sequence alone."""
        # atol / rtol apply to the mixed twin's check only; the teacher-forced one has its own limits.
        checks = self._checks(mixed_atol, mixed_atol, 0)
        agree, total, kl, ratio, worst = checks.quantized_cache(sess, self._held_out_stream())
        if mixed_path.is_file():
            # PyTorch has no such graph: the mixed twin must give what the plain one gives each sequence alone.
            mixed = session(mixed_path, self.inp.threads, sess.get_providers())
            for name, passed, diff, worst_name, detail in checks.mixed(sess, mixed,
                                                                       reference=lambda ids: checks.alone(sess, ids)):
                res.checks.append(Check(name, passed, max_abs_diff=diff, worst_output=worst_name,
                                        detail=detail + f"; reference: the plain {label} graph on each sequence alone"))
                res.max_abs_diff[name] = diff
        res.max_abs_diff["logits"] = worst
        detail = (f"{total} decode steps through {what}, teacher-forced on held-out text; top-1 agreement "
                  f"{agree}/{total} (recorded, not judged: near-flat distributions flip their top-1 on any noise)")
        res.checks.append(Check(f"mean KL divergence (PyTorch || {label}), nats", kl <= max_kl, value=kl,
                                threshold=max_kl, detail=detail, upper=True))
        res.checks.append(Check(f"perplexity ratio ({label} / PyTorch)", ratio <= max_ratio, value=ratio,
                                threshold=max_ratio, upper=True, detail=f"on the next true token at the same {total} steps"))

    def _weight_checks_for(self, kv8: bool) -> InplaceChecks:
        """The shared InplaceChecks, its limits set for a weight variant over an fp32 or an int8 cache."""
        t = self.inp.tolerances
        if self._weight_checks is None:
            self._weight_checks = self._checks(t.weights_mixed_atol, 0.0, 0)
        checks = self._weight_checks
        # MatMulNBits rows are not bit-equal across call shapes: over an int8 cache a value on a rounding boundary
        # may land one step away, and the logits follow it a little.
        checks.cache_atol = t.weights_kv8_mixed_cache_steps if kv8 else None
        checks.atol, checks.rtol = t.weights_mixed_atol, 0.0
        if kv8:
            checks.atol = t.weights_kv8_mixed_atol
        return checks

    def weight_quantized(self, sess: ort.InferenceSession, path: Path, bits: int, kv8: bool,
                         res: VariantResult) -> None:
        """A weight-quantized decoder, judged by what it changes against PyTorch fp32: the perplexity of held-out
        text (teacher-forced through its cache) and the greedy continuations of held-out prompts; its mixed twin
        must give what the plain quantized graph gives each sequence alone."""
        inp, t = self.inp, self.inp.tolerances
        max_ratio, min_greedy = t.weight_limits(bits)
        checks = self._weight_checks_for(kv8)
        mixed_path = path.parent / variant_files(res.variant)[1]
        if mixed_path.is_file():
            for name, passed, diff, worst_name, detail in checks.mixed(sess, session(mixed_path, inp.threads),
                                                                       same_schedule=True):
                res.checks.append(Check(name, passed, max_abs_diff=diff, worst_output=worst_name,
                                        detail=detail + f"; reference: the plain {res.variant} graph making the "
                                                        "same calls, decode rows and chunk apart"))
                res.max_abs_diff[name] = diff
        agree, total, kl, ratio, worst = checks.quantized_cache(sess, self._held_out_stream())
        res.max_abs_diff["logits"] = worst
        res.checks.append(Check(f"perplexity ratio ({res.variant} / PyTorch fp32)", ratio <= max_ratio, value=ratio,
                                threshold=max_ratio, upper=True,
                                detail=f"{total} decode steps teacher-forced on held-out text; mean KL {kl:.5f} "
                                       f"nats; top-1 agreement {agree}/{total}"))
        new = t.greedy_agreement_tokens
        prompts = greedy_prompts(inp.tokenizer, inp.texts)
        same = checks.greedy_prefixes(sess, prompts, new)
        mean = float(np.mean(same))
        res.checks.append(Check(f"greedy agreement (identical leading ids of {new})", mean >= min_greedy, value=mean,
                                threshold=min_greedy,
                                detail=f"{len(prompts)} held-out prompts; identical throughout: "
                                       f"{sum(n == new for n in same)}/{len(prompts)}; per prompt {same}"))
