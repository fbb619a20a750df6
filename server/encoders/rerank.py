"""Rerank and score: text pairs scored by an encoder, checked and bounded before any of them is tokenized.

Two kinds of model score a pair (left, right):
    a cross-encoder      a pair classifier (task "classify") with ONE label: the pair encoded together as
                         [CLS] left [SEP] right [SEP]; raw score = its logit, score = the package's recorded
                         activation of it (model.json head.function_to_apply: sentence-transformers'
                         CrossEncoder activation, else sigmoid, what CrossEncoder, TEI and vLLM answer by default;
                         sigmoid for a package made before the field; server/encoders/activation.py)
    an embedding model   (task "embed"): cosine of the two texts' vectors; raw score = score
A classifier of several labels has no single relevance score and is refused, naming `model`.

    pairs = Pairs.broadcast("query", query, "documents", documents)      # rerank: one query, N documents
    scores = await served.score(pairs, truncate, deadline)                # PairScores, one per pair, in order
    ranked = rank(scores.scores, top_n)                                    # best first

Every door's request shape (Cohere / Jina / vLLM's /v1/rerank, vLLM's /v1/score, TEI's /rerank, the task API's
Rerank) becomes Pairs with the door's own field names, so a refusal names the field the client sent.
"""
from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from modelpkg import Manifest
from server.admission import ENCODED_TOKEN_BYTES, AdmissionLimits, check_request_memory, check_rows
from server.encoders import activation
from server.protocol.errors import ServingError
from server.model import RuntimeConfig
from server.protocol.pairs import PairScores, Pairs, RankedDocument
from server.repository.signature import TensorSpec
from server.text.tokenizer import CHARS_PER_TOKEN_BOUND, EncodedText, pad_batch


class ScoringEncoder(Protocol):
    """What scoring uses of a served encoder (server/encoders/encoder.py's EncoderModel, which imports this module)."""

    name: str
    task: str
    manifest: Manifest
    runtime: RuntimeConfig
    inputs: list[TensorSpec]
    pad_id: int

    async def _encode(self, inputs: list[tuple[str, str | None]], truncate: bool, field: str,
                      text_attr: str, first_only: bool = False) -> list[EncodedText]: ...

    async def _logits(self, rows: list[Any], deadline: float | None) -> list[np.ndarray]: ...

    async def run_batched(self, feeds: dict[str, np.ndarray], deadline: float | None) -> dict[str, np.ndarray]: ...


def check_top_n(top_n: int | None, field: str = "top_n") -> None:
    if top_n is not None and (isinstance(top_n, bool) or top_n < 1):
        raise ServingError.invalid(field, f"must be >= 1 (or left out for every document), got {top_n}")


def rank(scores: list[float], top_n: int | None) -> list[RankedDocument]:
    """Indices by score, best first (ties in request order), at most top_n."""
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    keep = order if top_n is None else order[:top_n]
    return [RankedDocument(int(i), float(scores[i])) for i in keep]


def check_pairs(pairs: Pairs, max_length: int, truncate: bool, limits: AdmissionLimits) -> None:
    """The request's shape and size, before any text is tokenized: texts present and not empty, the number of
    pairs within max_rows_per_request (the cost bound of every encoder request), each text within what the
    model's max_length can hold (unless truncating)."""
    if not pairs.right:
        raise ServingError.invalid(pairs.right_field, "must hold at least one text")
    if not pairs.broadcasts and len(pairs.left) != len(pairs.right):
        raise ServingError.invalid(pairs.right_field, f"holds {len(pairs.right)} texts and {pairs.left_field} "
                                                      f"{len(pairs.left)}: give one {pairs.left_field} or as many")
    check_rows(pairs.right_field, len(pairs.right), limits)
    limit = max_length * CHARS_PER_TOKEN_BOUND
    named = [(pairs.left_name(i), text) for i, text in enumerate(pairs.left)]
    named += [(f"{pairs.right_field}[{i}]", text) for i, text in enumerate(pairs.right)]
    for name, text in named:
        if not isinstance(text, str) or not text.strip():
            raise ServingError.invalid(name, "must be a text that is not empty")
        if len(text) > limit and not truncate:
            raise ServingError.invalid(name, f"{len(text)} characters cannot fit the model's max_length {max_length} "
                                             "(ask for truncation to cut it)")


async def score_pairs(model: ScoringEncoder, pairs: Pairs, truncate: bool, deadline: float | None) -> PairScores:
    """Each pair's score by a one-label pair classifier or an embedding model (module docstring)."""
    limits = model.runtime.admission
    labels = list(model.manifest.labels)
    if model.task == "classify" and len(labels) != 1:
        raise ServingError.invalid("model", f"{model.name!r} classifies into {len(labels)} labels; scoring needs a "
                                            "cross-encoder (a pair classifier with one label) or an embedding model")
    if model.task not in ("classify", "embed"):
        raise ServingError.invalid("model", f"{model.name!r} is a {model.task} model: scoring needs a cross-encoder "
                                            "(a pair classifier with one label) or an embedding model")
    check_pairs(pairs, model.manifest.max_length, truncate, limits)
    if model.task == "classify":
        return await _cross_encoded(model, pairs, truncate, deadline)
    return await _cosines(model, pairs, truncate, deadline)


async def _cross_encoded(model: ScoringEncoder, pairs: Pairs, truncate: bool, deadline: float | None) -> PairScores:
    # Token overflow of a pair is named by its right text (`documents[i]`): the left one is shared or paired.
    rows = await model._encode(pairs.pairs(), truncate, pairs.right_field, "")
    check_request_memory(pairs.right_field, sum(len(r.ids) for r in rows), ENCODED_TOKEN_BYTES, model.runtime.admission)
    logits = np.asarray(await model._logits(rows, deadline), dtype=np.float64).reshape(len(rows))
    # [pairs, 1]: a softmax is over each pair's labels (its one logit), never across pairs
    scores = activation.apply(logits[:, None], activation.recorded(model.manifest, "sigmoid"))[:, 0]
    return PairScores(scores=scores.tolist(), raw=logits.tolist(),
                      tokens=sum(len(r.ids) for r in rows))


async def _cosines(model: ScoringEncoder, pairs: Pairs, truncate: bool, deadline: float | None) -> PairScores:
    check_rows(pairs.left_field, len(pairs.left), model.runtime.admission)
    try:
        left = await model._encode([(t, None) for t in pairs.left], truncate, pairs.left_field, "")
    except ServingError as exc:    # one broadcast text is `query`, not `query[0]`
        prefix = f"{pairs.left_field}[0]:"
        if not pairs.broadcasts or not exc.message.startswith(prefix):
            raise
        raise ServingError(exc.code, pairs.left_field + exc.message[len(prefix) - 1:]) from None
    right = await model._encode([(t, None) for t in pairs.right], truncate, pairs.right_field, "")
    rows = left + right
    check_request_memory(pairs.right_field, sum(len(r.ids) for r in rows), ENCODED_TOKEN_BYTES, model.runtime.admission)
    feeds = pad_batch(rows, model.pad_id, [spec.name for spec in model.inputs])
    vectors = np.asarray((await model.run_batched(feeds, deadline))["embeddings"], dtype=np.float64)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = vectors / np.where(norms > 0, norms, 1.0)       # a zero vector scores 0 against anything
    queries = unit[:len(left)]
    documents = unit[len(left):]
    cosine = (documents @ queries[0] if pairs.broadcasts else (queries * documents).sum(axis=1)).tolist()
    return PairScores(scores=cosine, raw=cosine, tokens=sum(len(r.ids) for r in rows))


__all__ = ["check_pairs", "check_top_n", "rank", "score_pairs"]
