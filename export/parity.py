"""The parity gate: every variant of a package against the PyTorch model it came from.

Encoders (export/parity_encoder.py): fp32 and optimized are compared elementwise (|ort - torch| <= atol + rtol *
|torch|) over a few batches; int8 (and fp16 on CUDA) by top-1 agreement and, for classifiers with labelled data,
task accuracy. The in-place decoder (export/parity_decoder.py, driven through export/parity_inplace.py's slots):
fp32 against PyTorch, prefill, cached decoding and greedy generation alike; its quantized variants by what they
change. Any breach fails the gate; the caller then publishes nothing (a refused quantized variant alone leaves
the package: export/parity_results.py).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import onnxruntime as ort
import torch

from .parity_decoder import DecoderChecks
from .parity_encoder import EncoderChecks
from .parity_inputs import GateInputs, session
from .parity_noise import NoiseScale
from .parity_results import REFUSED_ALONE, VariantResult, failure_table, refused
from .weights import WEIGHT_VARIANTS

log = logging.getLogger(__name__)

__all__ = ["Gate", "GateInputs", "failure_table", "refused", "run_gate", "session"]


class Gate:
    """Builds the reference cases once (PyTorch), then checks each variant's session against them."""

    def __init__(self, inp: GateInputs) -> None:
        self.inp = inp
        self.decoder = DecoderChecks(inp) if inp.task == "generate" else None
        self.encoder = None if self.decoder else EncoderChecks(inp)

    def _decoder_only(self, variant: str, what: str) -> DecoderChecks:
        if self.decoder is None:
            raise ValueError(f"variant {variant}: only the in-place decoder graph has {what}")
        return self.decoder

    def _exact(self, variant: str, path: Path) -> VariantResult:
        t = self.inp.tolerances
        atol, rtol = (t.fp32_atol, t.fp32_rtol) if variant == "fp32" else (t.optimized_atol, t.optimized_rtol)
        res = VariantResult(variant, "", {"atol": atol, "rtol": rtol})
        sess = session(path, self.inp.threads)
        if self.decoder is not None:
            self.decoder.exact(sess, path, atol, rtol, res)
        else:   # fp32: its tolerance follows PyTorch's own float noise (export/parity_noise.py)
            res.noise = NoiseScale(atol, rtol, self.inp.tolerances.fp32_noise_factor) if variant == "fp32" else None
            self.encoder.grid(sess, atol, rtol, res, res.noise)
        return res

    def _int8(self, path: Path) -> VariantResult:
        t = self.inp.tolerances
        if self.encoder is None:
            raise ValueError("variant int8: the in-place decoder graph has no int8 (per-token) variant")
        res = VariantResult("int8", "", {"top1_agreement": t.int8_top1_agreement,
                                         "max_accuracy_drop": t.int8_max_accuracy_drop})
        sess = session(path, self.inp.threads)
        self.encoder.agreement(sess, t.int8_top1_agreement, res)
        self.encoder.accuracy(sess, t.int8_max_accuracy_drop, res)
        return res

    def _weights(self, variant: str, path: Path) -> VariantResult:
        t = self.inp.tolerances
        bits, kv8 = WEIGHT_VARIANTS[variant]
        max_ratio, min_greedy = t.weight_limits(bits)
        res = VariantResult(variant, "", {"max_perplexity_ratio": max_ratio, "min_greedy_tokens": min_greedy,
                                          "mixed_atol": t.weights_kv8_mixed_atol if kv8 else t.weights_mixed_atol,
                                          **({"mixed_cache_steps": t.weights_kv8_mixed_cache_steps} if kv8
                                             else {})})
        self._decoder_only(variant, "weight-quantized variants").weight_quantized(
            session(path, self.inp.threads), path, bits, kv8, res)
        return res

    def _fp16(self, path: Path) -> VariantResult:
        t = self.inp.tolerances
        res = VariantResult("fp16", "", {"max_kl": t.fp16_max_kl, "max_perplexity_ratio": t.fp16_max_perplexity_ratio}
                            if self.decoder is not None else {"top1_agreement": t.fp16_top1_agreement})
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            res.status = "not run: no CUDA"
            return res
        sess = session(path, self.inp.threads, ["CUDAExecutionProvider"])
        if self.decoder is not None:
            self.decoder.fp16(sess, path, res)
        else:
            self.encoder.agreement(sess, t.fp16_top1_agreement, res)
        return res

    def check(self, variant: str, path: Path) -> VariantResult:
        t = self.inp.tolerances
        if variant in ("fp32", "optimized"):
            res = self._exact(variant, path)
        elif variant == "int8":
            res = self._int8(path)
        elif variant == "kv8":
            res = VariantResult(variant, "", {"max_kl": t.kv8_max_kl, "max_perplexity_ratio": t.kv8_max_perplexity_ratio})
            self._decoder_only(variant, "an int8 cache").kv8(session(path, self.inp.threads), path, res)
        elif variant in WEIGHT_VARIANTS:
            res = self._weights(variant, path)
        elif variant == "fp16":
            res = self._fp16(path)
            if res.passed is None:
                return res
        else:
            raise ValueError(f"variant: unknown {variant!r}")
        res.status = "passed" if all(c.passed for c in res.checks) else "failed"
        if self.decoder is None or variant not in ("fp32", "optimized"):   # the in-place checks log their own line
            log.info("parity %s: %s (%s)", variant, res.status,
                     ", ".join(f"{k} {v:.2e}" for k, v in res.max_abs_diff.items()) or "-")
        return res


def run_gate(inp: GateInputs, files: dict[str, Path]) -> tuple[bool, dict[str, VariantResult], float]:
    """Check every variant file; returns (passed, results, seconds)."""
    t0 = time.perf_counter()
    # Same thread budget for the PyTorch reference as for onnxruntime: tiny ops on a busy machine otherwise
    # spend most of their time waking idle pool threads.
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, inp.threads))
    try:
        gate = Gate(inp)
        results = {variant: gate.check(variant, path) for variant, path in files.items()}
    finally:
        torch.set_num_threads(before)
    # fp32 must have run and passed; other variants may be "not run" (fp16 without CUDA) but never failed, except
    # the quantized ones: one that breaches its limits is refused alone (see refused()).
    passed = "fp32" in results and results["fp32"].passed is True \
        and all(r.passed is not False for v, r in results.items() if v not in REFUSED_ALONE)
    return passed, results, time.perf_counter() - t0
