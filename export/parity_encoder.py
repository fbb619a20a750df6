"""The encoder tasks' parity checks (classify, token-classify, fill-mask): fp32 and optimized elementwise against
PyTorch over a few batches (single, padded, pairs); int8 and fp16 by top-1 agreement on held-out text and, for a
classifier with labelled data, by task accuracy."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnxruntime as ort

from .parity_inputs import Feeds, GateInputs, diff, encode_batch, torch_encoder
from .parity_noise import NoiseScale, float64_twin
from .parity_results import Check, VariantResult


class EncoderChecks:
    """Builds the reference cases once (PyTorch), then checks each variant's session against them."""

    def __init__(self, inp: GateInputs) -> None:
        self.inp = inp
        self._cases = self._encoder_cases()
        self._top1_cache: list[tuple[Feeds, np.ndarray, np.ndarray]] | None = None

    @property
    def _top1(self) -> list[tuple[Feeds, np.ndarray, np.ndarray]]:
        """The top-1 references, built on first use: only int8 / fp16 are judged by agreement, and for a
        classifier with the genre split these are a PyTorch pass over 1000 passages (most of an fp32 export)."""
        if self._top1_cache is None:
            self._top1_cache = self._top1_reference()
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
    def grid(self, sess: ort.InferenceSession, atol: float, rtol: float, res: VariantResult,
             noise: NoiseScale | None = None) -> None:
        """Every case's outputs elementwise; with `noise` (fp32) each case's atol per output follows PyTorch's own
        fp32-vs-fp64 gap on the case's inputs (export/parity_noise.py), `atol` its floor."""
        names = [o.name for o in sess.get_outputs()]
        twin = replace(self.inp, model=float64_twin(self.inp.model)) if noise is not None else None
        for case, feeds, refs in self._cases:
            outs = sess.run(names, feeds)
            worst, worst_name, ok_all = 0.0, names[0], True
            if noise is not None:
                for name, ref, ref64 in zip(names, refs, [torch_encoder(twin, feeds)]):
                    noise.record(name, ref, ref64)
            atols = noise.atols() if noise is not None else {}
            for name, out, ref in zip(names, outs, refs):
                d, ok = diff(out, ref, atols.get(name, atol), rtol)
                res.max_abs_diff[name] = max(res.max_abs_diff.get(name, 0.0), d) if d == d else float("nan")
                ok_all &= ok
                if not ok or d > worst:
                    worst, worst_name = d, name
            res.checks.append(Check(f"grid {case}", ok_all, max_abs_diff=worst, worst_output=worst_name,
                                    tolerance=atols or None, noise=dict(noise.last) if noise is not None else None))

    def agreement(self, sess: ort.InferenceSession, threshold: float, res: VariantResult) -> None:
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

    def accuracy(self, sess: ort.InferenceSession, max_drop: float, res: VariantResult) -> None:
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
