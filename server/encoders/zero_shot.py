"""Zero-shot classification on an NLI head, answered as transformers' ZeroShotClassificationPipeline answers.

Each (text, candidate label) is a premise / hypothesis pair, the hypothesis the label put into the template
("This example is {}."); the pairs of a request run through the model's batcher together. The head is a
sequence classifier whose labels name entailment (the pipeline: the first label starting with "entail", any
case); a model without such a label map is refused naming `model`. The pipeline's scores:

    one label per text (multi_label false, several candidates): softmax over the candidates' entailment logits
    multi_label, or one candidate: per candidate, softmax of (contradiction, entailment) logits, entailment's share

where the pipeline's contradiction column is column 0, or the last one when entailment is column 0 (its rule, kept
so the answers are the same). Labels come back best first (the pipeline's order: argsort reversed).

Cost: texts x candidate labels pairs are the request's rows (max_rows_per_request), bounded before tokenizing.
Truncation (asked for) cuts a pair's text and keeps its hypothesis, the pipeline's "only_first".
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from protos.results import ZeroShotClassification
from server.admission import check_response_bytes, check_rows
from server.encoders.rerank import ScoringEncoder
from server.protocol.errors import ServingError
from server.protocol.zero_shot import ZeroShotRequest, ZeroShotResult
from server.text.tokenizer import CHARS_PER_TOKEN_BOUND

# Bytes an answer spends per (text, label) besides the label's text: its score and field tags.
PAIR_OVERHEAD_BYTES = 16


class ZeroShotEncoder(ScoringEncoder, Protocol):
    version: int


def nli_columns(labels: list[str], name: str) -> tuple[int, int]:
    """(entailment, contradiction) logit columns as the pipeline finds them; INVALID_ARGUMENT naming `model` when
    the labels are no NLI label map (no entailment and contradiction labels)."""
    entail = next((i for i, label in enumerate(labels) if label.lower().startswith("entail")), -1)
    has_contradiction = any(label.lower().startswith("contradict") for label in labels)
    if entail < 0 or not has_contradiction:
        shown = ", ".join(labels[:8]) + (", ..." if len(labels) > 8 else "")
        raise ServingError.invalid("model", f"{name!r} has no NLI label map (labels {shown}): zero-shot "
                                            "classification needs labels named entailment and contradiction")
    return entail, (len(labels) - 1 if entail == 0 else 0)


def _check_cost(model: ZeroShotEncoder, request: ZeroShotRequest, hypotheses: list[str]) -> None:
    """Pairs, texts' and hypotheses' lengths and the answer's size, before anything is tokenized."""
    limits = model.runtime.admission
    texts, labels = len(request.texts), len(request.candidate_labels)
    check_rows(request.texts_field, texts, limits)
    check_rows("candidate_labels", labels, limits)
    if texts * labels > limits.max_rows_per_request:
        raise ServingError.invalid("candidate_labels", f"{texts} {request.texts_field} x {labels} candidate_labels = "
                                                       f"{texts * labels} pairs exceed max_rows_per_request "
                                                       f"{limits.max_rows_per_request} (fewer texts per request)")
    limit = model.manifest.max_length * CHARS_PER_TOKEN_BOUND
    named = [(f"{request.texts_field}[{i}]", t) for i, t in enumerate(request.texts)]
    named += [(f"candidate_labels[{j}]", h) for j, h in enumerate(hypotheses)]
    for field, text in named:
        if not text.strip():
            raise ServingError.invalid(field, "must be a text that is not empty")
        if len(text) > limit and not request.truncate:
            raise ServingError.invalid(field, f"{len(text)} characters cannot fit the model's max_length "
                                              f"{model.manifest.max_length} (ask for truncation to cut it)")
    label_bytes = sum(len(label.encode()) + PAIR_OVERHEAD_BYTES for label in request.candidate_labels)
    check_response_bytes(texts * label_bytes + sum(len(t.encode()) for t in request.texts), limits, "candidate_labels")


def scores_of(logits: np.ndarray, entail: int, contradiction: int, multi_label: bool) -> np.ndarray:
    """[texts, candidates] scores of [texts, candidates, labels] logits (module docstring)."""
    x = np.asarray(logits, dtype=np.float64)
    if multi_label or x.shape[1] == 1:
        pair = x[..., [contradiction, entail]]
        e = np.exp(pair - pair.max(axis=-1, keepdims=True))
        return (e / e.sum(axis=-1, keepdims=True))[..., 1]
    entailment = x[..., entail]
    e = np.exp(entailment - entailment.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


async def zero_shot(model: ZeroShotEncoder, request: ZeroShotRequest, deadline: float | None) -> ZeroShotResult:
    labels = list(model.manifest.labels)
    entail, contradiction = nli_columns(labels, model.name)
    hypotheses = request.hypotheses()
    _check_cost(model, request, hypotheses)
    n = len(hypotheses)
    pairs = [(text, hypothesis) for text in request.texts for hypothesis in hypotheses]
    try:
        # Truncation cuts the text only, never the hypothesis: the pipeline's "only_first".
        rows = await model._encode(pairs, request.truncate, "pairs", "", first_only=True)
    except ServingError as exc:   # name the pair's text (pairs[p] is text p // n) or its label (p % n)
        head, sep, rest = exc.message.partition("]")
        if not head.startswith("pairs[") or not sep:
            raise
        p = int(head[6:])
        if rest.startswith(".text_pair"):
            raise ServingError(exc.code, f"candidate_labels[{p % n}]{rest[len('.text_pair'):]}") from None
        raise ServingError(exc.code, f"{request.texts_field}[{p // n}]{rest}") from None
    logits = np.asarray(await model._logits(rows, deadline), dtype=np.float64)
    scores = scores_of(logits.reshape(len(request.texts), n, len(labels)), entail, contradiction, request.multi_label)
    results = []
    for text, row in zip(request.texts, scores):
        order = list(reversed(row.argsort()))   # the pipeline's order (ties included)
        results.append(ZeroShotClassification(sequence=text, labels=[request.candidate_labels[i] for i in order],
                                              scores=[float(row[i]) for i in order]))
    return ZeroShotResult(model=model.name, version=model.version, results=results,
                          tokens=sum(len(r.ids) for r in rows))


__all__ = ["nli_columns", "scores_of", "zero_shot"]
