"""Encoder tasks on a loaded model: text in, batched onnxruntime run, labels / mask candidates out."""
from __future__ import annotations

import asyncio

import numpy as np

from server.errors import ServingError
from server.model import ServedModel
from server.tokenization import EncodedText
from server.types import Classification, LabelScore, MaskPrediction, TokenCandidate

DEFAULT_FILL_MASK_TOP_K = 5


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


async def run_rows(model: ServedModel, rows: list[EncodedText], deadline: float | None) -> list[np.ndarray]:
    """'logits' of each row through the batcher; requests larger than a batch go in several pieces."""
    assert model.batcher is not None
    size = model.batcher.config.max_batch_size
    pieces = await asyncio.gather(*(model.batcher.submit(rows[i:i + size], deadline)
                                    for i in range(0, len(rows), size)))
    return [row for piece in pieces for row in piece["logits"]]


async def classify(model: ServedModel, inputs: list[tuple[str, str | None]], top_k: int, truncate: bool,
                   deadline: float | None) -> list[Classification]:
    if model.task != "classify":
        raise ServingError.invalid("model", f"{model.name!r} is a {model.task} model, not classify")
    if top_k < 0:
        raise ServingError.invalid("top_k", f"must be >= 0, got {top_k}")
    assert model.loaded is not None and model.loaded.encoder is not None
    labels: list[str] = model.manifest["labels"]
    rows = model.loaded.encoder.encode(inputs, truncate, field="inputs")
    results = []
    for logits in await run_rows(model, rows, deadline):
        probs = softmax(logits)
        order = np.argsort(-probs, kind="stable")
        keep = order if top_k == 0 else order[:top_k]
        scores = [LabelScore(labels[i], float(probs[i])) for i in keep]
        results.append(Classification(label=labels[order[0]], score=float(probs[order[0]]), scores=scores))
    return results


def mask_token_id(model: ServedModel) -> int:
    manifest = model.manifest
    mask = (manifest.get("special_tokens") or {}).get("mask")
    if isinstance(mask, int):
        return mask
    assert model.loaded is not None and model.loaded.encoder is not None
    found = model.loaded.encoder.tokenizer.token_to_id(manifest["mask_token"])
    if found is None:
        raise ServingError.invalid("model", f"{model.name!r} has no mask token id")
    return found


async def fill_mask(model: ServedModel, texts: list[str], top_k: int, truncate: bool,
                    deadline: float | None) -> list[list[MaskPrediction]]:
    if model.task != "fill-mask":
        raise ServingError.invalid("model", f"{model.name!r} is a {model.task} model, not fill-mask")
    if top_k < 0:
        raise ServingError.invalid("top_k", f"must be >= 0, got {top_k}")
    assert model.loaded is not None and model.loaded.encoder is not None
    encoder = model.loaded.encoder
    mask_id = mask_token_id(model)
    mask_token = model.manifest["mask_token"]
    rows = encoder.encode([(t, None) for t in texts], truncate, field="texts", text_attr="")
    positions = []
    for i, row in enumerate(rows):
        found = [p for p, t in enumerate(row.ids) if t == mask_id]
        if not found:
            raise ServingError.invalid(f"texts[{i}]", f"holds no mask token {mask_token!r}")
        positions.append(found)
    k = top_k or DEFAULT_FILL_MASK_TOP_K
    special = {v for v in (model.manifest.get("special_tokens") or {}).values() if isinstance(v, int)}
    drop = {(model.manifest.get("special_tokens") or {}).get(n) for n in ("cls", "sep", "pad")} - {None}
    tokenizer = encoder.tokenizer
    results: list[list[MaskPrediction]] = []
    for row, found, logits in zip(rows, positions, await run_rows(model, rows, deadline)):
        masks = []
        for pos in found:
            probs = softmax(logits[pos])
            kk = min(k, probs.shape[-1])
            best = np.argpartition(-probs, kk - 1)[:kk]
            best = best[np.argsort(-probs[best], kind="stable")]
            candidates = []
            for token_id in best.tolist():
                filled = [token_id if p == pos else t for p, t in enumerate(row.ids) if t not in drop]
                candidates.append(TokenCandidate(
                    token=tokenizer.decode([token_id], skip_special_tokens=token_id not in special),
                    token_id=int(token_id), score=float(probs[token_id]),
                    sequence=tokenizer.decode(filled, skip_special_tokens=False)))
            masks.append(MaskPrediction(position=pos, candidates=candidates))
        results.append(masks)
    return results
