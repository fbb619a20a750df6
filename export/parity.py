"""The parity gate: every variant of a package against the PyTorch model it came from.

fp32 and optimized are compared elementwise (|ort - torch| <= atol + rtol * |torch|) over a grid of shapes;
int8 (and fp16 on CUDA) by top-1 agreement and, for classifiers with labelled data, task accuracy. The
decoder additionally proves cached decoding equals full recompute and that greedy generation gives the
same ids as PyTorch. Any breach fails the gate; the caller then publishes nothing.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from tokenizers import Tokenizer

from modelpkg import past_name

from .config import GridConfig, Tolerances
from .heldout import LabelledExample
from .weights import WEIGHT_VARIANTS

# Quantized variants trade accuracy for speed: one the gate refuses leaves the package and the rest is published
# (fp32, optimized and fp16 must match the checkpoint, or nothing is).
REFUSED_ALONE = frozenset({"int8", *WEIGHT_VARIANTS})

log = logging.getLogger(__name__)

Feeds = dict[str, np.ndarray]


@dataclass
class Check:
    name: str
    passed: bool
    max_abs_diff: float | None = None
    worst_output: str | None = None
    value: float | None = None      # agreement / accuracy checks
    threshold: float | None = None
    detail: str = ""
    upper: bool | None = None       # True: the value must stay at or below the threshold (else at or above)

    def as_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None and v != ""}


@dataclass
class VariantResult:
    variant: str
    status: str  # "passed" | "failed" | "not run: <why>"
    tolerance: dict[str, float]
    checks: list[Check] = field(default_factory=list)
    max_abs_diff: dict[str, float] = field(default_factory=dict)  # per output, over the whole grid

    @property
    def passed(self) -> bool | None:
        return None if self.status.startswith("not run") else self.status == "passed"

    def as_json(self) -> dict:
        return {"passed": self.passed, "status": self.status, "tolerance": self.tolerance,
                "max_abs_diff": self.max_abs_diff, "checks": [c.as_json() for c in self.checks]}


@dataclass
class GateInputs:
    """Everything the gate needs besides the graphs."""

    model: torch.nn.Module
    task: str
    tokenizer: Tokenizer
    special_tokens: dict[str, int | None]
    max_length: int
    num_layers: int
    num_heads: int
    head_dim: int
    texts: list[str]
    labelled: list[LabelledExample] | None
    tolerances: Tolerances
    grid: GridConfig
    threads: int = 1
    cache_layout: str = "concat"      # decoder: "inplace" graphs are driven through shared slot buffers
    num_kv_heads: int | None = None   # decoder: None = num_heads
    token_types: bool = True          # encoder: the graph takes token_type_ids (BERT, ALBERT; not RoBERTa/DistilBERT)


def session(path: Path, threads: int, providers: list[str] | None = None) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=providers or ["CPUExecutionProvider"])


def _diff(out: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> tuple[float, bool]:
    if out.shape != ref.shape:
        return float("inf"), False
    if not (np.isfinite(out).all() and np.isfinite(ref).all()):
        return float("nan"), False
    d = np.abs(out.astype(np.float64) - ref.astype(np.float64))
    ok = bool((d <= atol + rtol * np.abs(ref)).all())
    return float(d.max()) if d.size else 0.0, ok


# ----------------------------------------------------------------------------- inputs


def _pad_id(inp: GateInputs) -> int:
    for key in ("pad", "eos", "unk"):
        if inp.special_tokens.get(key) is not None:
            return int(inp.special_tokens[key])
    return 0


def encode_batch(inp: GateInputs, texts: list[str], pairs: list[str | None] | None = None,
                 mask_every: int = 0) -> Feeds:
    """Right-padded encoder feeds; mask_every=k replaces every k-th non-special token with the mask id."""
    encs = [inp.tokenizer.encode(t, p) if p else inp.tokenizer.encode(t)
            for t, p in zip(texts, pairs or [None] * len(texts))]
    n = min(inp.max_length, max(len(e.ids) for e in encs))
    ids = np.full((len(encs), n), _pad_id(inp), dtype=np.int64)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for r, e in enumerate(encs):
        k = min(n, len(e.ids))
        ids[r, :k], mask[r, :k], types[r, :k] = e.ids[:k], 1, e.type_ids[:k]
        if mask_every:
            special = np.array(e.special_tokens_mask[:k], dtype=bool)
            candidates = np.flatnonzero(~special)
            ids[r, candidates[r % mask_every::mask_every]] = inp.special_tokens["mask"]
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    if not inp.token_types:
        del feeds["token_type_ids"]
    return feeds


def token_stream(inp: GateInputs) -> np.ndarray:
    ids: list[int] = []
    for t in inp.texts:
        ids += inp.tokenizer.encode(t).ids
    return np.array(ids, dtype=np.int64)


def left_padded(inp: GateInputs, stream: np.ndarray, batch: int, length: int, offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """[batch, length] ids and mask; row r is left-padded by a different amount (row 0 by none)."""
    pads = [0, min(length - 1, 2), min(length - 1, 5)]
    ids = np.full((batch, length), _pad_id(inp), dtype=np.int64)
    mask = np.zeros((batch, length), dtype=np.int64)
    for r in range(batch):
        p = pads[r % 3]
        start = (offset + 13 * r) % max(1, len(stream) - length)
        ids[r, p:] = stream[start:start + length - p]
        mask[r, p:] = 1
    return ids, mask


def positions(mask: np.ndarray) -> np.ndarray:
    """Position ids that count only real tokens (docs/model-package.md)."""
    return np.clip(np.cumsum(mask, axis=-1) - 1, 0, None)


# ----------------------------------------------------------------------------- torch side


def torch_encoder(inp: GateInputs, feeds: Feeds) -> np.ndarray:
    with torch.no_grad():
        types = feeds.get("token_type_ids")
        out = inp.model(torch.from_numpy(feeds["input_ids"]), attention_mask=torch.from_numpy(feeds["attention_mask"]),
                        token_type_ids=None if types is None else torch.from_numpy(types))
    return (out[0] if isinstance(out, (tuple, list)) else out).numpy()


def torch_decoder(inp: GateInputs, ids: np.ndarray, mask: np.ndarray, pos: np.ndarray,
                  past: list[np.ndarray]) -> list[np.ndarray]:
    """[logits, present.0.key, present.0.value, ...] like the graph."""
    pkv = [(torch.from_numpy(past[2 * i]), torch.from_numpy(past[2 * i + 1])) for i in range(inp.num_layers)]
    with torch.no_grad():
        logits, presents = inp.model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                                     position_ids=torch.from_numpy(pos), past_key_values=pkv)
    flat = [logits.numpy()]
    for k, v in presents:
        flat += [k.numpy(), v.numpy()]
    return flat


def empty_past(inp: GateInputs, batch: int) -> list[np.ndarray]:
    z = np.zeros((batch, inp.num_heads, 0, inp.head_dim), dtype=np.float32)
    return [z] * (2 * inp.num_layers)


def decoder_feeds(inp: GateInputs, ids: np.ndarray, mask: np.ndarray, pos: np.ndarray,
                  past: list[np.ndarray]) -> Feeds:
    feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": pos}
    for i in range(inp.num_layers):
        feeds[past_name(i, "key")] = past[2 * i]
        feeds[past_name(i, "value")] = past[2 * i + 1]
    return feeds


# ----------------------------------------------------------------------------- the gate


class Gate:
    """Builds the reference cases once (PyTorch), then checks each variant's session against them."""

    def __init__(self, inp: GateInputs) -> None:
        self.inp = inp
        self.decoder = inp.task == "generate"
        self.inplace = self.decoder and inp.cache_layout == "inplace"
        self._cases = [] if self.inplace else self._decoder_cases() if self.decoder else self._encoder_cases()
        self._top1_cache: list[tuple[Feeds, np.ndarray, np.ndarray]] | None = None
        self._weight_checks = None

    @property
    def _top1(self) -> list[tuple[Feeds, np.ndarray, np.ndarray]]:
        """The top-1 references, built on first use: only int8 / fp16 are judged by agreement, and for a
        classifier with the genre split these are a PyTorch pass over 1000 passages (most of an fp32 export)."""
        if self._top1_cache is None:
            self._top1_cache = [] if self.inplace else self._top1_reference()
        return self._top1_cache

    # -- reference cases
    def _encoder_cases(self) -> list[tuple[str, Feeds, list[np.ndarray]]]:
        inp, texts = self.inp, self.inp.texts
        mask_every = 5 if inp.task == "fill-mask" else 0
        by_len = sorted(texts, key=len)
        sets = {
            "batch1": ([texts[0]], None),
            "batch3-padded": ([by_len[0], by_len[-1], by_len[len(by_len) // 2]], None),
            "batch3-pairs": (texts[3:6], texts[6:9]),
        }
        cases = []
        for name, (t, p) in sets.items():
            feeds = encode_batch(inp, t, p, mask_every)
            cases.append((name, feeds, [torch_encoder(inp, feeds)]))
        return cases

    def _decoder_cases(self) -> list[tuple[str, Feeds, list[np.ndarray]]]:
        inp, g = self.inp, self.inp.grid
        stream = token_stream(inp)
        cases = []
        for b in g.batches:
            for p in g.past_lengths:
                for s in g.new_lengths:
                    ids, mask = left_padded(inp, stream, b, p + s, offset=7 * p + s)
                    pos = positions(mask)
                    past = empty_past(inp, b)
                    if p:
                        past = torch_decoder(inp, ids[:, :p], mask[:, :p], pos[:, :p], past)[1:]
                    feeds = decoder_feeds(inp, ids[:, p:], mask, pos[:, p:], past)
                    cases.append((f"b{b}-past{p}-new{s}", feeds, torch_decoder(inp, ids[:, p:], mask, pos[:, p:], past)))
        return cases

    def _top1_reference(self) -> list[tuple[Feeds, np.ndarray, np.ndarray]]:
        """Held-out inputs for top-1 agreement: (feeds, reference logits, boolean selection of rows/positions)."""
        inp = self.inp
        out = []
        examples = [(t, None) for t in inp.texts]
        if inp.labelled:
            examples += [(e.text, e.text_pair) for e in inp.labelled]
        for i in range(0, len(examples), 16):
            chunk = examples[i:i + 16]
            texts, pairs = [t for t, _ in chunk], [p for _, p in chunk]
            if self.decoder:
                encs = [inp.tokenizer.encode(t).ids[: inp.max_length] or [_pad_id(inp)] for t in texts]
                n = max(len(e) for e in encs)
                ids = np.full((len(encs), n), _pad_id(inp), dtype=np.int64)
                mask = np.zeros_like(ids)
                for r, e in enumerate(encs):
                    ids[r, n - len(e):], mask[r, n - len(e):] = e, 1
                feeds = decoder_feeds(inp, ids, mask, positions(mask), empty_past(inp, len(encs)))
                ref = torch_decoder(inp, ids, mask, positions(mask), empty_past(inp, len(encs)))[0]
                out.append((feeds, ref, mask.astype(bool)))
            else:
                feeds = encode_batch(inp, texts, pairs, 5 if inp.task == "fill-mask" else 0)
                ref = torch_encoder(inp, feeds)
                if inp.task == "fill-mask":
                    sel = feeds["input_ids"] == inp.special_tokens["mask"]
                elif inp.task == "token-classify":   # every real token is a prediction
                    sel = feeds["attention_mask"].astype(bool)
                else:
                    sel = np.ones(len(texts), dtype=bool)
                out.append((feeds, ref, sel))
        return out

    # -- checks
    def _grid(self, sess: ort.InferenceSession, atol: float, rtol: float, res: VariantResult) -> None:
        names = [o.name for o in sess.get_outputs()]
        for case, feeds, refs in self._cases:
            outs = sess.run(names, feeds)
            worst, worst_name, ok_all = 0.0, names[0], True
            for name, out, ref in zip(names, outs, refs):
                d, ok = _diff(out, ref, atol, rtol)
                res.max_abs_diff[name] = max(res.max_abs_diff.get(name, 0.0), d) if d == d else float("nan")
                ok_all &= ok
                if not ok or d > worst:
                    worst, worst_name = d, name
            res.checks.append(Check(f"grid {case}", ok_all, max_abs_diff=worst, worst_output=worst_name))

    def _ort_step(self, sess: ort.InferenceSession, ids: np.ndarray, mask: np.ndarray,
                  past: list[np.ndarray]) -> list[np.ndarray]:
        pos = positions(mask)[:, mask.shape[1] - ids.shape[1]:]
        return sess.run(None, decoder_feeds(self.inp, ids, mask, pos, past))

    def _recompute(self, sess: ort.InferenceSession, atol: float, rtol: float, res: VariantResult) -> None:
        inp = self.inp
        n = inp.grid.recompute_tokens
        ids, mask = left_padded(inp, token_stream(inp), 3, n, offset=3)
        full = self._ort_step(sess, ids, mask, empty_past(inp, 3))
        prompt = 3
        out = self._ort_step(sess, ids[:, :prompt], mask[:, :prompt], empty_past(inp, 3))
        steps, past = [out[0]], out[1:]
        for t in range(prompt, n):
            out = self._ort_step(sess, ids[:, t:t + 1], mask[:, :t + 1], past)
            steps.append(out[0])
            past = out[1:]
        cached = np.concatenate(steps, axis=1)
        # Only real positions are comparable: a left-pad query attends to nothing real, and its (masked, never
        # used) output depends on how many masked keys it saw, which differs between one pass and steps.
        real = mask.astype(bool)
        d1, ok1 = _diff(cached[real], full[0][real], atol, rtol)
        kv = [_diff(a.transpose(0, 2, 1, 3)[real], b.transpose(0, 2, 1, 3)[real], atol, rtol)
              for a, b in zip(past, full[1:])]
        d2, ok2 = max(d for d, _ in kv), all(ok for _, ok in kv)
        res.checks.append(Check("cached decoding == full recompute", ok1 and ok2, max_abs_diff=max(d1, d2),
                                worst_output="logits" if d1 >= d2 else "present",
                                detail=f"prompt {prompt} + {n - prompt} single-token steps, batch 3 left-padded, "
                                       "real positions"))

    def _greedy(self, sess: ort.InferenceSession, res: VariantResult) -> None:
        from training.gpt import generate_greedy

        inp = self.inp
        prompt = 6
        new = min(inp.grid.greedy_new_tokens, inp.max_length - prompt)
        ids, mask = left_padded(inp, token_stream(inp), 2, prompt, offset=11)
        want = generate_greedy(inp.model, torch.from_numpy(ids), torch.from_numpy(mask), new).numpy()
        out = self._ort_step(sess, ids, mask, empty_past(inp, 2))
        got = []
        for step in range(new):
            nxt = out[0][:, -1].argmax(-1).astype(np.int64)
            got.append(nxt)
            if step == new - 1:
                break
            mask = np.concatenate([mask, np.ones((2, 1), dtype=np.int64)], axis=1)
            out = self._ort_step(sess, nxt[:, None], mask, out[1:])
        got_ids = np.stack(got, axis=1)
        same = got_ids.shape == want.shape and bool((got_ids == want).all())
        first = "" if same else f"first difference at step {int(np.argmax((got_ids != want).any(0)))}"
        res.checks.append(Check(f"greedy {new} tokens identical ids", same, value=float(same), threshold=1.0,
                                detail=first or f"batch 2 left-padded, prompt {prompt}"))

    def _inplace(self, sess: ort.InferenceSession, path: Path, atol: float, rtol: float, res: VariantResult) -> None:
        from .decoder_graph import MIXED_FILE
        from .parity_inplace import InplaceChecks

        inp = self.inp
        checks = InplaceChecks(inp.model, token_stream(inp), inp.num_layers, inp.num_kv_heads or inp.num_heads,
                               inp.head_dim, inp.max_length, _pad_id(inp), atol, rtol, inp.grid.greedy_new_tokens)
        mixed_path = path.parent / MIXED_FILE
        mixed = session(mixed_path, inp.threads) if res.variant == "fp32" and mixed_path.is_file() else None
        for name, passed, diff, worst, detail in checks.run_all(sess, mixed):
            res.checks.append(Check(name, passed, max_abs_diff=diff if worst else None, worst_output=worst or None,
                                    value=None if worst else float(passed), threshold=None if worst else 1.0,
                                    detail=detail))
            if worst:
                res.max_abs_diff[name] = diff
        log.info("parity %s (in-place cache): %s", res.variant,
                 ", ".join(f"{c.name}: {'ok' if c.passed else 'FAIL'}" for c in res.checks))

    def _kv8(self, sess: ort.InferenceSession, path: Path, res: VariantResult) -> None:
        """The int8 cache: teacher-forced decoding on text its scales were not calibrated on."""
        from .decoder_graph import KV8_MIXED_FILE

        if not self.inplace:
            raise ValueError("variant kv8: only the in-place decoder graph has an int8 cache")
        t = self.inp.tolerances
        self._teacher_forced(sess, path.parent / KV8_MIXED_FILE, res, "kv8", "the int8 cache", t.kv8_max_kl,
                             t.kv8_max_perplexity_ratio, t.kv8_mixed_atol)

    def _teacher_forced(self, sess: ort.InferenceSession, mixed_path: Path, res: VariantResult, label: str,
                        what: str, max_kl: float, max_ratio: float, mixed_atol: float) -> None:
        """A variant of the in-place graph that is not fp32 throughout (an int8 cache, fp16): judged by what it
        changes — the next-token distributions (KL) and perplexity, teacher-forced on held-out text — and its
        mixed twin by equality with the plain graph on each sequence alone."""
        from .heldout import kv8_texts
        from .parity_inplace import InplaceChecks

        inp = self.inp
        # atol / rtol apply to the mixed twin's check only; the teacher-forced one has its own limits.
        checks = InplaceChecks(inp.model, token_stream(inp), inp.num_layers, inp.num_kv_heads or inp.num_heads,
                               inp.head_dim, inp.max_length, _pad_id(inp), mixed_atol, mixed_atol, 0)
        stream = np.array(inp.tokenizer.encode(kv8_texts(inp.texts)[1]).ids, dtype=np.int64)
        agree, total, kl, ratio, worst = checks.quantized_cache(sess, stream)
        if mixed_path.is_file():
            # PyTorch has no such graph: the mixed twin must give what the plain one gives each sequence alone.
            mixed = session(mixed_path, inp.threads, sess.get_providers())
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

    def _weight_quantized(self, sess: ort.InferenceSession, path: Path, bits: int, kv8: bool,
                          res: VariantResult) -> None:
        """A weight-quantized decoder, judged by what it changes against PyTorch fp32: the perplexity of held-out
        text (teacher-forced through its cache) and the greedy continuations of held-out prompts; its mixed twin
        must give what the plain quantized graph gives each sequence alone."""
        from .heldout import greedy_prompts, kv8_texts
        from .parity_inplace import InplaceChecks
        from .weights import variant_files

        inp, t = self.inp, self.inp.tolerances
        if not self.inplace:
            raise ValueError(f"variant {res.variant}: only the in-place decoder graph has weight-quantized variants")
        max_ratio, min_greedy = t.weight_limits(bits)
        if self._weight_checks is None:   # one for every weight variant: it keeps PyTorch's greedy references
            self._weight_checks = InplaceChecks(inp.model, token_stream(inp), inp.num_layers,
                                                inp.num_kv_heads or inp.num_heads, inp.head_dim, inp.max_length,
                                                _pad_id(inp), t.weights_mixed_atol, 0.0, 0)
        checks = self._weight_checks
        # MatMulNBits rows are not bit-equal across call shapes (~1e-6): over an int8 cache a value on a rounding
        # boundary may land one step away, and the logits follow it a little.
        checks.cache_atol = t.weights_kv8_mixed_cache_steps if kv8 else None
        checks.atol, checks.rtol = t.weights_mixed_atol, 0.0
        if kv8:
            checks.atol = t.weights_kv8_mixed_atol
        mixed_path = path.parent / variant_files(res.variant)[1]
        if mixed_path.is_file():
            for name, passed, diff, worst_name, detail in checks.mixed(sess, session(mixed_path, inp.threads),
                                                                       same_schedule=True):
                res.checks.append(Check(name, passed, max_abs_diff=diff, worst_output=worst_name,
                                        detail=detail + f"; reference: the plain {res.variant} graph making the "
                                                        "same calls, decode rows and chunk apart"))
                res.max_abs_diff[name] = diff
        stream = np.array(inp.tokenizer.encode(kv8_texts(inp.texts)[1]).ids, dtype=np.int64)
        agree, total, kl, ratio, worst = checks.quantized_cache(sess, stream)
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

    def _agreement(self, sess: ort.InferenceSession, threshold: float, res: VariantResult) -> None:
        agree = total = 0
        worst = 0.0
        for feeds, ref, sel in self._top1:
            out = sess.run(None, feeds)[0]
            worst = max(worst, float(np.abs(out - ref).max()))
            a, b = out.argmax(-1), ref.argmax(-1)
            agree += int((a == b)[sel].sum())
            total += int(sel.sum())
        rate = agree / total if total else 0.0
        res.max_abs_diff["logits"] = worst
        res.checks.append(Check("top-1 agreement", rate >= threshold, value=rate, threshold=threshold,
                                detail=f"{agree}/{total} held-out {'positions' if self.inp.task != 'classify' else 'inputs'}"))

    def _accuracy(self, sess: ort.InferenceSession, max_drop: float, res: VariantResult) -> None:
        inp = self.inp
        if inp.task != "classify" or not inp.labelled:
            return
        labels = np.array([e.label for e in inp.labelled])
        ref_pred, got_pred = [], []
        for i in range(0, len(inp.labelled), 16):
            chunk = inp.labelled[i:i + 16]
            feeds = encode_batch(inp, [e.text for e in chunk], [e.text_pair for e in chunk])
            ref_pred.append(torch_encoder(inp, feeds).argmax(-1))
            got_pred.append(sess.run(None, feeds)[0].argmax(-1))
        acc_ref = float((np.concatenate(ref_pred) == labels).mean())
        acc_got = float((np.concatenate(got_pred) == labels).mean())
        res.checks.append(Check("task accuracy within 1 point of fp32", acc_ref - acc_got <= max_drop + 1e-12,
                                value=acc_got, threshold=acc_ref - max_drop,
                                detail=f"fp32 {acc_ref:.4f}, variant {acc_got:.4f} on {len(labels)} labelled examples"))

    # -- per variant
    def check(self, variant: str, path: Path) -> VariantResult:
        t = self.inp.tolerances
        threads = self.inp.threads
        if variant in ("fp32", "optimized"):
            atol, rtol = (t.fp32_atol, t.fp32_rtol) if variant == "fp32" else (t.optimized_atol, t.optimized_rtol)
            res = VariantResult(variant, "", {"atol": atol, "rtol": rtol})
            sess = session(path, threads)
            if self.inplace:
                self._inplace(sess, path, atol, rtol, res)
                res.status = "passed" if all(c.passed for c in res.checks) else "failed"
                return res
            self._grid(sess, atol, rtol, res)
            if self.decoder:
                self._recompute(sess, atol, rtol, res)
                self._greedy(sess, res)
        elif variant == "int8":
            res = VariantResult(variant, "", {"top1_agreement": t.int8_top1_agreement,
                                              "max_accuracy_drop": t.int8_max_accuracy_drop})
            sess = session(path, threads)
            self._agreement(sess, t.int8_top1_agreement, res)
            self._accuracy(sess, t.int8_max_accuracy_drop, res)
        elif variant == "kv8":
            res = VariantResult(variant, "", {"max_kl": t.kv8_max_kl, "max_perplexity_ratio": t.kv8_max_perplexity_ratio})
            self._kv8(session(path, threads), path, res)
        elif variant in WEIGHT_VARIANTS:
            bits, kv8 = WEIGHT_VARIANTS[variant]
            max_ratio, min_greedy = t.weight_limits(bits)
            res = VariantResult(variant, "", {"max_perplexity_ratio": max_ratio, "min_greedy_tokens": min_greedy,
                                              "mixed_atol": t.weights_kv8_mixed_atol if kv8 else t.weights_mixed_atol,
                                              **({"mixed_cache_steps": t.weights_kv8_mixed_cache_steps} if kv8
                                                 else {})})
            self._weight_quantized(session(path, threads), path, bits, kv8, res)
        elif variant == "fp16":
            res = VariantResult(variant, "", {"max_kl": t.fp16_max_kl, "max_perplexity_ratio": t.fp16_max_perplexity_ratio}
                                if self.inplace else {"top1_agreement": t.fp16_top1_agreement})
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                res.status = "not run: no CUDA"
                return res
            sess = session(path, threads, ["CUDAExecutionProvider"])
            if self.inplace:
                from .decoder_graph import FP16_MIXED_FILE
                self._teacher_forced(sess, path.parent / FP16_MIXED_FILE, res, "fp16", "the fp16 graph and cache",
                                     t.fp16_max_kl, t.fp16_max_perplexity_ratio, t.fp16_mixed_atol)
            else:
                self._agreement(sess, t.fp16_top1_agreement, res)
        else:
            raise ValueError(f"variant: unknown {variant!r}")
        res.status = "passed" if all(c.passed for c in res.checks) else "failed"
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


def refused(results: dict[str, VariantResult]) -> list[str]:
    """The quantized variants the gate refused: the package publishes without them."""
    return [v for v, r in results.items() if v in REFUSED_ALONE and r.passed is False]


def failure_table(results: dict[str, VariantResult], tokenizer: dict[str, Any] | None = None) -> str:
    """Max differences per output (and failed checks) of every variant, for the terminal."""
    rows = [f"{'variant':<10} {'output / check':<44} {'value':>12}  {'limit':<22} result"]
    for v, r in results.items():
        if r.passed is None:
            rows.append(f"{v:<10} {'-':<44} {'-':>12}  {'-':<22} {r.status}")
            continue
        if "atol" in r.tolerance:
            limit = f"atol {r.tolerance['atol']:g} rtol {r.tolerance['rtol']:g}"
            # A row is an output (the grid's) or a check (the in-place checks key their differences by name).
            bad = {c.worst_output for c in r.checks if not c.passed and c.worst_output} | \
                  {c.name for c in r.checks if not c.passed}
            for name, d in r.max_abs_diff.items():
                rows.append(f"{v:<10} {name:<44} {d:>12.3e}  {limit:<22} {'FAIL' if name in bad else 'ok'}")
        for c in r.checks:
            if c.value is not None or not c.passed and not c.worst_output:
                val = f"{c.value:.4f}" if c.value is not None else "-"
                lim = f"{'<=' if c.upper else '>='} {c.threshold:.4f}" if c.threshold is not None else ""
                rows.append(f"{v:<10} {c.name[:44]:<44} {val:>12}  {lim:<22} {'ok' if c.passed else 'FAIL'}")
        for c in r.checks:
            if not c.passed and c.worst_output:
                rows.append(f"{v:<10}   failed: {c.name} ({c.worst_output} max_abs_diff {c.max_abs_diff:.3e})")
    if tokenizer is not None and not tokenizer.get("passed", True):
        for f in tokenizer.get("failures", [])[:10]:
            rows.append(f"{'tokenizer':<10} {f}")
    return "\n".join(rows)
