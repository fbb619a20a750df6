"""The embedding task's parity gate: the ONNX graph against a reference on the held-out texts, batch 1 and padded
batches of 3, once per prompt the model names (the prompt's text prepended, as sentence-transformers does).

The reference is sentence-transformers itself (`SentenceTransformer(dir).encode`) for a checkpoint whose
sentence-transformers modules decide the graph, so a module the graph misses cannot pass; the PyTorch encoder with
our own pooling head otherwise (a plain encoder, flags that override the config, or sentence-transformers not
installed: logged). Checks: the same dimension, max |diff| within the fp32 tolerance, cosine >= MIN_COSINE.
An int8 variant (`--variants int8`) is checked against the same reference by its smallest cosine over every
held-out text (Tolerances.int8_min_cosine); one that falls short is refused alone and the package ships fp32.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnxruntime
import torch
from tokenizers import Tokenizer
from torch import nn

from .errors import ExportError
from .heldout import BUILTIN_TEXTS

log = logging.getLogger(__name__)

MIN_COSINE = 0.99999
# (texts, prompt name or None for the default) -> [len(texts), dimension]
Reference = Callable[[list[str], "str | None"], np.ndarray]


@dataclass
class EmbedParity:
    """The gate's result for one variant (the shape parity.json's `variants` entries have)."""

    passed: bool
    max_abs_diff: dict[str, float]
    min_cosine: float
    failures: list[str]
    reference: str = "torch"

    def as_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "status": "passed" if self.passed else "FAILED", "reference": self.reference,
                "max_abs_diff": self.max_abs_diff, "min_cosine": self.min_cosine, "failures": self.failures}


def encode_batch(tok: Tokenizer, texts: list[str], pad_id: int, token_types: bool) -> dict[str, np.ndarray]:
    """Right-padded graph feeds, as the server builds them."""
    rows = [e.ids for e in tok.encode_batch(texts)]
    lengths = np.array([len(r) for r in rows])
    width = int(lengths.max())
    feeds = {"input_ids": np.array([r + [pad_id] * (width - len(r)) for r in rows], dtype=np.int64),
             "attention_mask": (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)}
    if token_types:
        feeds["token_type_ids"] = np.zeros_like(feeds["input_ids"])
    return feeds


def torch_reference(adapter: nn.Module, tok: Tokenizer, pad_id: int, token_types: bool,
                    prompts: dict[str, str], default: str | None) -> Reference:
    """The PyTorch encoder + our pooling head on the same token ids the graph gets."""
    def encode(texts: list[str], name: str | None) -> np.ndarray:
        prefix = prompts.get(name or default or "", "")
        feeds = encode_batch(tok, [prefix + t for t in texts], pad_id, token_types)
        with torch.no_grad():
            return adapter(*(torch.from_numpy(feeds[k]) for k in feeds)).numpy()
    return encode


def sentence_transformers_reference(checkpoint: Path) -> Reference | None:
    """sentence-transformers' own encode of the checkpoint; None (logged) when the library is not installed."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        log.warning("sentence-transformers is not installed: the embedding gate compares with the PyTorch encoder "
                    "and our own pooling head (install the export extra for the library's own reference)")
        return None
    try:
        model = SentenceTransformer(str(checkpoint), device="cpu")
    except Exception as exc:  # the library raises many types (OSError, ValueError, its own) for what it cannot load
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(f"checkpoint: sentence-transformers cannot load {checkpoint} for the gate's "
                          f"reference: {first}") from None

    def encode(texts: list[str], name: str | None) -> np.ndarray:
        return model.encode(texts, prompt_name=name, batch_size=len(texts), convert_to_numpy=True,
                            show_progress_bar=False)
    return encode


def gate_cases(prompts: dict[str, str]) -> list[tuple[str, str | None, list[list[str]]]]:
    """(case name, prompt name, groups of texts): the default prompt on batch 1 and padded batches of 3, each other
    named prompt with a text on one padded batch."""
    texts = list(BUILTIN_TEXTS)[:12]
    cases: list[tuple[str, str | None, list[list[str]]]] = [
        ("batch1", None, [[t] for t in texts[:4]]),
        ("batch3_padded", None, [texts[i:i + 3] for i in range(0, 12, 3)])]
    cases += [(f"prompt_{name}", name, [texts[3:6]]) for name, text in sorted(prompts.items()) if text]
    return cases


def int8_cases(prompts: dict[str, str]) -> list[tuple[str, str | None, list[list[str]]]]:
    """The fp32 cases and every held-out text in padded batches of 8: the int8 graph's vectors are judged by
    cosine alone, so it sees more text than fp32's elementwise check."""
    texts = list(BUILTIN_TEXTS)
    return gate_cases(prompts) + [("batch8_padded", None, [texts[i:i + 8] for i in range(0, len(texts), 8)])]


def run_embed_gate(reference: Reference, graph: Path, tok: Tokenizer, pad_id: int, token_types: bool, atol: float,
                   threads: int, prompts: dict[str, str], default: str | None, reference_name: str = "torch",
                   min_cosine: float = MIN_COSINE, quantized: bool = False) -> EmbedParity:
    """fp32: max |diff| <= atol and cosine >= MIN_COSINE on gate_cases; `quantized` (int8): cosine >= min_cosine on
    int8_cases (its elementwise differences are recorded, not judged)."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    diffs: dict[str, float] = {}
    failures: list[str] = []
    min_cos = 1.0
    for name, prompt_name, groups in (int8_cases(prompts) if quantized else gate_cases(prompts)):
        prefix = prompts.get(prompt_name or default or "", "")
        worst = 0.0
        for group in groups:
            got = session.run(["embeddings"], encode_batch(tok, [prefix + t for t in group], pad_id, token_types))[0]
            ref = np.asarray(reference(group, prompt_name), dtype=np.float32)
            if got.shape != ref.shape:
                failures.append(f"{name}: graph answers {list(got.shape)}, {reference_name} {list(ref.shape)}")
                return EmbedParity(False, diffs, -1.0, failures, reference_name)
            worst = max(worst, float(np.abs(got - ref).max()))
            cos = (got * ref).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
            min_cos = min(min_cos, float(cos.min()))
        diffs[name] = worst
        if worst > atol and not quantized:
            failures.append(f"{name}: max |onnx - {reference_name}| {worst:.2e} > {atol:.0e}")
    if min_cos < min_cosine:
        failures.append(f"cosine {min_cos:.7f} < {min_cosine}")
    return EmbedParity(not failures, diffs, min_cos, failures, reference_name)
