"""Quantized variants of an encoder-decoder package: w8 / w4 (both graphs' weight MatMuls as MatMulNBits) and int8
(per-channel 7-bit weights times per-token uint8 activations, export/int8.py's rewrite).

Made by export/weights.py's quantize_graph, the decoders' quantizer: the encoder graph (its layers and the cross
key/value projection of every decoder layer) and the decoder graph (its layers and the head, rewritten from the
tied FusedMatMul(transB) into a MatMul over its own transposed copy, `lm_head_bits` wide; the embedding lookups keep
the fp32 tables). What was measured to choose that (docs/model-package.md, "Encoder-decoder packages";
docs/BENCHMARKS.md, "Weight-quantized encoder-decoders"):
  - the decoder carries the speed: on the OPUS-MT shape (6+6 layers, 512 wide, 58k vocabulary) a w8 decode step is
    much faster than fp32 at batch 1 and 8, and an 8-bit head is a large part of that gain (the 58k x 512 head is
    as big as the six layers); the encoder gains less;
  - on the trained g2p model quantizing the encoder too moves greedy outputs little more than the decoder alone
    (docs/MODELS.md, "The served package: fp32 vs its weight-quantized variants").

int8 runs every weight product, the head's included, on onnxruntime's integer GEMM (AMX / VNNI where the CPU has
them) with one activation scale per row, computed in the graph: on the OPUS-MT shape at batch 64 the batch job ran
faster than w8 and kept more outputs identical to fp32 (docs/BENCHMARKS.md). No SmoothQuant factors here: its
calibration runs the graph on representative inputs, and the in-place decoder's are a slot cache, not a text.

The gate judges a variant by what it changes on held-out sources (export/heldout.seq2seq_sources), against the
PyTorch fp32 model: greedy outputs (identical outputs, leading identical tokens) and, teacher-forced along
PyTorch's greedy output, the perplexity ratio and mean KL of the next-token distributions. A variant that breaches
its limits (export/config.py) is refused alone; the package keeps the rest.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
import torch

from .config import Tolerances, WeightQuantConfig
from .int8 import WEIGHT_LEVELS, per_token_int8
from .parity_results import Check, VariantResult
from .parity_inplace import leading_equal
from .speed import session
from .seq2seq_parity import GREEDY_TOKENS, Seq2SeqGateInputs, SlotDriver, graph_greedy
from .variants import VariantBuild
from .weights import HEAD_WEIGHT, head_as_matmul, quantize_graph

log = logging.getLogger(__name__)

# MatMulNBits variant -> weight bits (no int8-cache twins: the encoder-decoder's cache stays fp32)
SEQ2SEQ_WEIGHT_VARIANTS: dict[str, int] = {"w8": 8, "w4": 4}
INT8 = "int8"
# every quantized variant -> the bits its gate limits are those of (export/config.py seq2seq_weight_limits)
SEQ2SEQ_QUANTIZED: dict[str, int] = {**SEQ2SEQ_WEIGHT_VARIANTS, INT8: 8}
CHUNK = 16     # sources decoded together by the gate (slot buffers and logits stay small on a 58k vocabulary)


def variant_files(variant: str) -> dict[str, str]:
    return {"encoder": f"encoder.{variant}.onnx", "decoder": f"decoder.{variant}.onnx"}


def build_variant(variant: str, staging: Path, encoder_file: str, decoder_file: str,
                  quant: dict[int, WeightQuantConfig]) -> tuple[VariantBuild, dict[str, str]]:
    """Quantize the staged fp32 graphs into `variant`'s two files; its VariantBuild and {encoder, decoder} files."""
    files = variant_files(variant)
    sources = {"encoder": encoder_file, "decoder": decoder_file}
    if variant == INT8:
        def int8(model: onnx.ModelProto, side: str) -> tuple[onnx.ModelProto, int]:
            if side == "decoder" and not head_as_matmul(model):
                raise ValueError("the decoder graph has no head (FusedMatMul over the target table) to quantize")
            return model, per_token_int8(model)
        n = _rewrite(staging, sources, files, int8)
        notes = [f"per-channel 7-bit weights (int8 codes in [-{WEIGHT_LEVELS}, {WEIGHT_LEVELS}]) x per-token uint8 "
                 f"activations (MatMulIntegerToFloat); encoder "
                 f"{n['encoder']} weight MatMuls, decoder {n['decoder']} (its head, {HEAD_WEIGHT}, included); "
                 f"no smoothing; with {files['encoder']}"]
        return VariantBuild(INT8, files["decoder"], fused_operators={"MatMulIntegerToFloat": sum(n.values())},
                            notes=notes), files
    bits = SEQ2SEQ_WEIGHT_VARIANTS[variant]
    cfg = quant[bits]
    counts = _rewrite(staging, sources, files, lambda model, _: quantize_graph(model, bits, cfg))
    enc, dec = counts["encoder"], counts["decoder"]
    head = f"{dec['lm_head bits']} bits" if dec["lm_head bits"] != 32 else "fp32"
    notes = [f"MatMulNBits {bits} bits, block {cfg.block_size}, accuracy_level {cfg.accuracy_level}, {cfg.algorithm}"
             f"{' symmetric' if cfg.symmetric and cfg.algorithm == 'rtn' else ''}; encoder {enc['MatMulNBits']} "
             f"weight MatMuls quantized ({enc['MatMul left fp32']} left fp32), decoder {dec['MatMulNBits']} "
             f"({dec['MatMul left fp32']} left fp32), head {head}; with {files['encoder']}"]
    build = VariantBuild(variant, files["decoder"],
                         fused_operators={"MatMulNBits": enc["MatMulNBits"] + dec["MatMulNBits"]}, notes=notes)
    return build, files


def _rewrite(staging: Path, sources: dict[str, str], files: dict[str, str],
             rewrite: Callable[[onnx.ModelProto, str], tuple[onnx.ModelProto, Any]]) -> dict[str, Any]:
    """Each side's fp32 graph rewritten into the variant's file (checked first); side -> what `rewrite` counted."""
    counts = {}
    for side, src in sources.items():
        model, counts[side] = rewrite(onnx.load(str(staging / src)), side)
        onnx.checker.check_model(model)
        onnx.save(model, str(staging / files[side]))
    return counts


def describe(variant: str, quant: dict[int, WeightQuantConfig]) -> dict:
    """model.json `quantization[variant]` of an encoder-decoder package."""
    if variant == INT8:
        return {"method": "MatMulIntegerToFloat",
                "weights": f"int8 codes in [-{WEIGHT_LEVELS}, {WEIGHT_LEVELS}] (7 bits), one scale per output channel",
                "activations": "uint8, one scale per row (token), computed in the graph", "head": "int8",
                "smoothing": None, "kv_cache": "float32", "graphs": ["encoder", "decoder"]}
    bits = SEQ2SEQ_WEIGHT_VARIANTS[variant]
    return {**quant[bits].as_json(bits), "method": "MatMulNBits", "kv_cache": "float32",
            "graphs": ["encoder", "decoder"]}


class WeightVariantGate:
    """The held-out checks of the weight-quantized variants; PyTorch's greedy references are made once."""

    def __init__(self, inp: Seq2SeqGateInputs, tolerances: Tolerances) -> None:
        if not inp.held_out:
            raise ValueError("held-out sources: none (the tokenizer gave no ids)")
        self.inp, self.t = inp, tolerances
        self.n_new = min(GREEDY_TOKENS, inp.max_target_length - 1)
        self._refs: list[list[int]] | None = None

    def references(self) -> list[list[int]]:
        """PyTorch fp32's greedy ids of each held-out source (eos included when it ended there), CHUNK sources a
        batch (right-padded, masked: a row's ids equal its run alone but on a near tie, which the limits allow)."""
        from training.seq2seq import generate_greedy

        if self._refs is None:
            inp, refs = self.inp, []
            with torch.no_grad():
                for lo in range(0, len(inp.held_out), CHUNK):
                    chunk = inp.held_out[lo:lo + CHUNK]
                    ids = torch.full((len(chunk), max(map(len, chunk))), inp.pad)
                    for r, s in enumerate(chunk):
                        ids[r, :len(s)] = torch.tensor(s)
                    mask = (torch.arange(ids.shape[1])[None] < torch.tensor([len(s) for s in chunk])[:, None]).long()
                    for row in generate_greedy(inp.model, ids, mask, self.n_new).tolist():
                        refs.append(row[:row.index(inp.eos) + 1] if inp.eos in row else row)
            self._refs = refs
        return self._refs

    def _torch_logprobs(self, source: list[int], target: list[int]) -> np.ndarray:
        with torch.no_grad():
            m = self.inp.model
            logits = m.decode(torch.tensor([target]), m.cross_key_values(m.encode(torch.tensor([source]))))[0][0]
            return torch.log_softmax(logits.double(), -1).numpy()

    def check(self, variant: str, encoder_path: Path, decoder_path: Path) -> VariantResult:
        inp = self.inp
        min_identical, max_ratio = self.t.seq2seq_weight_limits(SEQ2SEQ_QUANTIZED[variant])
        res = VariantResult(variant, "", {"min_identical_outputs": min_identical, "max_perplexity_ratio": max_ratio})
        # No spinning: PyTorch's references run between the graphs' calls, on the same cores.
        enc, dec = session(encoder_path, inp.threads, False), session(decoder_path, inp.threads, False)
        refs = self.references()
        sources = inp.held_out
        got: list[list[int]] = []
        nll_q = nll_ref = kl = 0.0
        positions = 0
        worst = 0.0
        for lo in range(0, len(sources), CHUNK):
            chunk, want = sources[lo:lo + CHUNK], refs[lo:lo + CHUNK]
            drv = SlotDriver(enc, dec, inp, len(chunk))
            drv.encode(0, chunk)
            got += graph_greedy(drv, len(chunk), self.n_new)
            # Teacher-forced along PyTorch's greedy output: the start token, then every id but the last, predicting
            # each next id (one right-padded first call: the slot buffers are fresh).
            targets = [[inp.decoder_start] + w[:-1] for w in want]
            drv = SlotDriver(enc, dec, inp, len(chunk))
            drv.encode(0, chunk)
            logits = drv.first(0, targets).astype(np.float64)
            for r, (s, t, w) in enumerate(zip(chunk, targets, want)):
                ref = self._torch_logprobs(s, t)
                q = logits[r, :len(t)]
                q = q - q.max(-1, keepdims=True)
                q = q - np.log(np.exp(q).sum(-1, keepdims=True))
                idx = np.arange(len(w))
                nll_ref -= float(ref[idx, w].sum())
                nll_q -= float(q[idx, w].sum())
                kl += float((np.exp(ref) * (ref - q)).sum())
                worst = max(worst, float(np.abs(q - ref).max()))
                positions += len(w)
        n = len(sources)
        same = [g[:len(w)] == w for g, w in zip(got, refs)]
        leading = [leading_equal(g, w) / len(w) for g, w in zip(got, refs)]
        identical = sum(same) / n
        ratio = float(np.exp((nll_q - nll_ref) / positions))
        res.max_abs_diff["log-probabilities"] = worst
        res.checks.append(Check(f"greedy: identical outputs ({variant} / PyTorch fp32)", identical >= min_identical,
                                value=identical, threshold=min_identical,
                                detail=f"{sum(same)}/{n} held-out sources, up to {self.n_new} new tokens; leading "
                                       f"identical tokens {float(np.mean(leading)):.4f} of the reference's on "
                                       "average"))
        res.checks.append(Check(f"perplexity ratio ({variant} / PyTorch fp32)", ratio <= max_ratio, value=ratio,
                                threshold=max_ratio, upper=True,
                                detail=f"{positions} positions teacher-forced along PyTorch's greedy outputs; mean KL "
                                       f"(PyTorch || {variant}) {kl / positions:.6f} nats"))
        res.status = "passed" if all(c.passed for c in res.checks) else "failed"
        log.info("seq2seq parity %s: %s (identical %.4f, perplexity ratio %.5f, mean KL %.2e)", variant, res.status,
                 identical, ratio, kl / positions)
        return res
