"""A served encoder (classify, token-classify, fill-mask or embed): text or raw tensors in, one dynamic batcher, onnxruntime.

Task calls tokenize, then submit their rows to the batcher; raw KServe ModelInfer submits the caller's
tensors to the same batcher, so both kinds of request share batches. Every request's cost is checked before it
runs (server/admission.py): rows per request before tokenizing, fill-mask candidates and the answer's estimated
size before compute. A request of more rows than a batch goes in pieces, a few queued at a time
(server/encoders/pieces.py).
"""
from __future__ import annotations

import asyncio
import functools

import numpy as np

from modelpkg import TOKENIZER_FILE
from server.runtime import tracing
from server.encoders import activation
from server.admission import (ENCODED_TOKEN_BYTES, ENTITY_BYTES, check_candidates, check_request_memory,
                              check_response_bytes, check_rows, fill_mask_bytes, tensor_bytes)
from server.encoders.batching import DynamicBatcher
from server.repository.consistency import check_tokenizer, probe_encoder
from server.protocol.errors import ServingError
from server.encoders.length_buckets import LengthBucketedRun
from server.encoders.matryoshka import check_dimensions, shorten
from server.encoders.memory import returning_memory
from server.model import Feeds, Loaded, ServedModel
from server.protocol.pairs import PairScores, Pairs
from server.encoders.pieces import run_in_pieces
from server.encoders.prompts import prompt_text, with_prompt
from server.encoders.rerank import score_pairs
from server.encoders.zero_shot import zero_shot
from server.sessions import run_failure, warm_up_encoder
from server.encoders.token_aggregation import DEFAULT_IGNORE, TokenEntity, TokenRow, aggregate, check_strategy
from server.text.tokenizer import INLINE_TEXT_CHARS, EncodedText, TextEncoder, pad_batch
from server.text.spans import TokenSpan, check_ids, check_text_bound, encode_spans, special_ids
from protos.results import Classification, LabelScore, MaskPrediction, TokenCandidate
from server.protocol.types import ClassifyResult, EmbedResult, FillMaskResult, TokenClassifyResult
from server.protocol.zero_shot import ZeroShotRequest, ZeroShotResult

DEFAULT_FILL_MASK_TOP_K = 5
# Tokens of one token-classification answer above which its entities are built in a worker thread.
INLINE_TOKENS = 2048


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


def _token_rules(tokenizer) -> tuple:
    """How the package tokenizer makes words of tokens, read once: its decoder joins tokens into words (else
    spaces), a continuing-subword prefix makes it word-aware, and its unk token's id."""
    model = tokenizer.model
    decoder = tokenizer.decoder
    join = decoder.decode if decoder is not None else " ".join
    unk = getattr(model, "unk_token", None)
    unk_id = tokenizer.token_to_id(unk) if isinstance(unk, str) else None
    return join, bool(getattr(model, "continuing_subword_prefix", None)), unk_id


class EncoderModel(ServedModel):
    def __init__(self, parts: Loaded) -> None:
        super().__init__(parts)
        self.encoder = TextEncoder(self.package.file(TOKENIZER_FILE), self.manifest.max_length)
        self.pad_id = self.manifest.special_token("pad") or 0
        # Outputs with a sequence axis come back padded to their batch's longest row: cut to the request's.
        self._sequence_outputs = [s.name for s in self.outputs if len(s.dims) > 1 and s.dims[1] == ("sequence",)]
        sequence_inputs = [s.name for s in self.inputs if len(s.dims) > 1 and s.dims[1] == ("sequence",)]
        # A batch of short and long rows runs in groups of similar length (server/encoders/length_buckets.py).
        self.batcher = DynamicBatcher(LengthBucketedRun(self.runner.run, sequence_inputs, self._sequence_outputs),
                                      {"input_ids": self.pad_id}, self.runtime.batch, self.metrics, self.name,
                                      self.stats)
        self._special_ids = special_ids(dict(self.manifest.special_tokens))
        self._token_rules = _token_rules(self.encoder.tokenizer) if self.task == "token-classify" else None
        self._label_bytes = max((len(label.encode()) for label in self.manifest.labels), default=0)
        activation.check_recorded(self.manifest)

    @property
    def max_batch_size(self) -> int:
        return self.runtime.batch.max_batch_size

    def warm_up(self) -> None:
        """The graph on a few shapes, then the parts checked against each other (server/repository/consistency.py): the
        tokenizer against model.json, the graph on the largest ids and on tokenizer-made sequences up to
        max_length."""
        vocabulary = check_tokenizer(self.package, self.encoder.tokenizer)
        warm_up_encoder(self.runner, self.manifest, self.max_batch_size)
        names = [spec.name for spec in self.inputs]
        probe_encoder(self.runner.run, self.package, self.encoder, vocabulary,
                      lambda ids, types: pad_batch([EncodedText(i, t) for i, t in zip(ids, types)], self.pad_id, names))

    async def start(self) -> None:
        self.batcher.start()

    async def close(self) -> None:
        await self.batcher.stop()

    # ------------------------------------------------------------------ batched runs

    async def run_batched(self, feeds: Feeds, deadline: float | None) -> Feeds:
        """Every output for these rows through the batcher; more rows than a batch go in several pieces."""
        rows = next(iter(feeds.values())).shape[0]
        size = self.max_batch_size
        span = tracing.start("batcher", rows=rows) if tracing.enabled() else None
        try:
            if rows <= size:
                outputs = await self.batcher.submit(feeds, deadline)
            else:
                pieces = await run_in_pieces(self.batcher.enqueue, feeds, size,
                                             self.runtime.admission.max_pieces_per_request, deadline)
                outputs = {name: np.concatenate([self._widen(p[name], pieces, name) for p in pieces])
                           for name in pieces[0]}
        except BaseException as exc:
            tracing.end(span, exc)
            raise
        tracing.end(span)
        return outputs

    @staticmethod
    def _widen(array: np.ndarray, pieces: list[Feeds], name: str) -> np.ndarray:
        """Pieces of one request may come back from batches of different widths: pad to the widest."""
        if array.ndim < 2:
            return array
        width = max(p[name].shape[1] for p in pieces)
        if array.shape[1] == width:
            return array
        return np.pad(array, [(0, 0), (0, width - array.shape[1])] + [(0, 0)] * (array.ndim - 2))

    async def infer(self, inputs: Feeds, outputs: list[str] | None, deadline: float | None) -> Feeds:
        self.check_raw_inputs(inputs)
        self.check_deadline(deadline)
        rows = next(iter(inputs.values())).shape[0]
        wanted = self.wanted_outputs(outputs)
        self.check_raw_cost(inputs, wanted)
        if rows == 0:  # nothing to batch: the graph answers the empty shapes itself
            try:
                result = await asyncio.get_running_loop().run_in_executor(None, self.runner.run, inputs)
            except Exception as exc:
                raise run_failure(exc) from None
        else:
            feeds = {spec.name: inputs[spec.name] for spec in self.inputs}  # the graph's input order
            result = await self.run_batched(feeds, deadline)
            width = inputs["input_ids"].shape[1] if "input_ids" in inputs else None
            for name in self._sequence_outputs:
                if width is not None and name in result:
                    result[name] = result[name][:, :width]
        return {name: result[name] for name in wanted}

    async def _encode(self, inputs: list[tuple[str, str | None]], truncate: bool, field: str,
                      text_attr: str, first_only: bool = False) -> list[EncodedText]:
        """TextEncoder.encode; a request with much text (1024 texts near the per-text bound are megabytes) is
        tokenized in a worker thread: encode_batch releases the GIL, so the event loop serves others meanwhile."""
        size = sum(len(text) + len(pair or "") for text, pair in inputs)
        if size <= INLINE_TEXT_CHARS:
            return self.encoder.encode(inputs, truncate, field=field, text_attr=text_attr, first_only=first_only)
        return await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(self.encoder.encode, inputs, truncate, field=field, text_attr=text_attr,
                                    first_only=first_only))

    async def _logits(self, rows: list, deadline: float | None) -> list[np.ndarray]:
        feeds = pad_batch(rows, self.pad_id, [spec.name for spec in self.inputs])
        return list((await self.run_batched(feeds, deadline))["logits"])

    # ------------------------------------------------------------------ tasks

    @returning_memory
    async def classify(self, inputs: list[tuple[str, str | None]], top_k: int, truncate: bool,
                       deadline: float | None, function_to_apply: str | None = None) -> ClassifyResult:
        """function_to_apply: softmax | sigmoid | none, None = the package's (server/encoders/activation.py)."""
        if self.task != "classify":
            raise self._not("classify")
        if top_k < 0:
            raise ServingError.invalid("top_k", f"must be >= 0, got {top_k}")
        function = activation.check_function(function_to_apply) or activation.recorded(self.manifest, "softmax")
        limits = self.runtime.admission
        check_rows("inputs", len(inputs), limits)
        labels = list(self.manifest.labels)
        check_response_bytes(len(inputs) * sum(len(label.encode()) + 16 for label in labels) * 2, limits, "inputs")
        rows = await self._encode(inputs, truncate, "inputs", ".text")
        results = []
        for logits in await self._logits(rows, deadline):
            probs = activation.apply(logits, function)
            order = np.argsort(-probs, kind="stable")
            keep = order if top_k == 0 else order[:top_k]
            scores = [LabelScore(labels[i], float(probs[i])) for i in keep]
            results.append(Classification(label=labels[order[0]], score=float(probs[order[0]]), scores=scores))
        return ClassifyResult(model=self.name, version=self.version, results=results, labels=labels)

    @property
    def dimension(self) -> int | None:
        """An embedding's length, from the graph's declared output (None when the graph leaves it open)."""
        spec = next((s for s in self.outputs if s.name == "embeddings"), None)
        last = spec.dims[-1] if spec is not None and spec.dims else None
        return last if isinstance(last, int) else None

    @returning_memory
    async def embed(self, texts: list[str], truncate: bool, deadline: float | None,
                    dimensions: int | None = None, prompt_name: str | None = None) -> EmbedResult:
        """One vector per text: the graph pools (and normalizes) inside, so padding in a batch changes nothing.
        dimensions: the length the caller asks for (server/encoders/matryoshka.py), checked before anything runs;
        prompt_name: one of the model's prompts, prepended to every text (server/encoders/prompts.py)."""
        if self.task != "embed":
            raise self._not("embed")
        matryoshka = self.manifest.matryoshka
        check_dimensions(self.name, self.dimension, dimensions, matryoshka)
        prefix = prompt_text(self.name, self.manifest.extra, prompt_name)
        if not texts:
            raise ServingError.invalid("texts", "at least one text is required")
        limits = self.runtime.admission
        check_rows("texts", len(texts), limits)
        rows = await self._encode([(t, None) for t in with_prompt(texts, prefix)], truncate, "texts", "")
        width = max(len(r.ids) for r in rows)
        check_response_bytes(tensor_bytes(self.outputs, {"batch": len(rows), "sequence": width}, width), limits, "texts")
        feeds = pad_batch(rows, self.pad_id, [spec.name for spec in self.inputs])
        vectors = (await self.run_batched(feeds, deadline))["embeddings"]
        check_dimensions(self.name, vectors.shape[1], dimensions, matryoshka)   # (a graph that declares no length)
        normalized = self.manifest.normalized_embeddings
        vectors = shorten(np.asarray(vectors, dtype=np.float32), dimensions, normalized)
        return EmbedResult(model=self.name, version=self.version, embeddings=vectors,
                           token_counts=[len(r.ids) for r in rows], normalized=normalized)

    @returning_memory
    async def score(self, pairs: Pairs, truncate: bool, deadline: float | None) -> PairScores:
        return await score_pairs(self, pairs, truncate, deadline)

    async def zero_shot_classify(self, request: ZeroShotRequest, deadline: float | None) -> ZeroShotResult:
        if self.task != "classify":
            raise self._not("classify")
        return await zero_shot(self, request, deadline)

    async def tokenize(self, text: str) -> list[TokenSpan]:
        """The tokens the model would see for this text (special tokens included), with their offsets."""
        check_text_bound(text, self.manifest.max_length, "prompt")
        special = self._special_ids
        if len(text) <= INLINE_TEXT_CHARS:
            return encode_spans(self.encoder.tokenizer, text, special, False)
        return await asyncio.get_running_loop().run_in_executor(None, encode_spans, self.encoder.tokenizer, text,
                                                                special, True)

    async def detokenize(self, token_ids: list[int]) -> str:
        tokenizer = self.encoder.tokenizer
        check_ids(token_ids, self.manifest.vocab_size or tokenizer.get_vocab_size(), self.manifest.max_length)
        return tokenizer.decode(token_ids, skip_special_tokens=False)

    def mask_token_id(self) -> int:
        mask = self.manifest.special_token("mask")
        if mask is not None:
            return mask
        found = self.encoder.tokenizer.token_to_id(self.manifest.mask_token or "")
        if found is None:
            raise ServingError.invalid("model", f"{self.name!r} has no mask token id")
        return found

    def _predictions(self, rows: list[EncodedText], positions: list[list[int]], logits: list[np.ndarray],
                     k: int) -> list[list[MaskPrediction]]:
        """Each mask's k best tokens, each with the text's sequence filled with it (a worker thread: the
        sequences of one mask are decoded in one batch)."""
        tokenizer = self.encoder.tokenizer
        special_ids = self.manifest.special_tokens
        special = {v for v in special_ids.values() if isinstance(v, int)}
        drop = {special_ids.get(n) for n in ("cls", "sep", "pad")} - {None}
        results: list[list[MaskPrediction]] = []
        for row, found, row_logits in zip(rows, positions, logits):
            kept = [(p, t) for p, t in enumerate(row.ids) if t not in drop]
            masks = []
            for pos in found:
                probs = softmax(row_logits[pos])
                kk = min(k, probs.shape[-1])
                best = np.argpartition(-probs, kk - 1)[:kk]
                best = best[np.argsort(-probs[best], kind="stable")].tolist()
                filled = [[token_id if p == pos else t for p, t in kept] for token_id in best]
                sequences = tokenizer.decode_batch(filled, skip_special_tokens=False)
                candidates = [TokenCandidate(token=tokenizer.decode([token_id], skip_special_tokens=token_id not in special),
                                             token_id=int(token_id), score=float(probs[token_id]), sequence=sequence)
                              for token_id, sequence in zip(best, sequences)]
                masks.append(MaskPrediction(position=pos, candidates=candidates))
            results.append(masks)
        return results

    @returning_memory
    async def fill_mask(self, texts: list[str], top_k: int, truncate: bool,
                        deadline: float | None) -> FillMaskResult:
        if self.task != "fill-mask":
            raise self._not("fill-mask")
        if not texts:
            raise ServingError.invalid("texts", "at least one text is required")
        if top_k < 0:
            raise ServingError.invalid("top_k", f"must be >= 0, got {top_k}")
        limits = self.runtime.admission
        check_rows("texts", len(texts), limits)
        mask_id = self.mask_token_id()
        mask_token = self.manifest.mask_token or ""
        rows = await self._encode([(t, None) for t in texts], truncate, "texts", "")
        positions = []
        for i, row in enumerate(rows):
            found = [p for p, t in enumerate(row.ids) if t == mask_id]
            if not found:
                raise ServingError.invalid(f"texts[{i}]", f"holds no mask token {mask_token!r}")
            positions.append(found)
        tokenizer = self.encoder.tokenizer
        # Every candidate carries its text's whole filled sequence: masks x top_k is the answer's size and the
        # work of building it, bounded before anything is computed.
        k = min(top_k or DEFAULT_FILL_MASK_TOP_K, tokenizer.get_vocab_size())
        masks = [len(found) for found in positions]
        check_candidates(masks, k, limits)
        sequence_bytes = [len(tokenizer.decode(row.ids, skip_special_tokens=False).encode()) for row in rows]
        check_response_bytes(fill_mask_bytes(masks, k, sequence_bytes), limits, "top_k")
        logits = await self._logits(rows, deadline)
        # Building up to max_fill_mask_candidates filled sequences takes tens of ms: off the event loop.
        results = await asyncio.get_running_loop().run_in_executor(None, self._predictions, rows, positions, logits, k)
        return FillMaskResult(model=self.name, version=self.version, results=results, mask_token=mask_token)

    # ------------------------------------------------------------------ token classification

    def _token_rows(self, texts: list[str], rows: list[EncodedText], logits: list[np.ndarray], strategy: str,
                    ignore_labels: list[str]) -> list[list[TokenEntity]]:
        """Each text's entities (server/encoders/token_aggregation.py), with the package tokenizer's own rules
        (_token_rules)."""
        join, word_aware, unk_id = self._token_rules
        labels = self.manifest.labels
        out = []
        for text, row, row_logits in zip(texts, rows, logits):
            enc = row.encoding
            view = TokenRow(text, row.ids, enc.tokens, enc.offsets, enc.special_tokens_mask)
            out.append(aggregate(view, row_logits, labels, strategy, join, word_aware, unk_id, ignore_labels))
        return out

    @returning_memory
    async def token_classify(self, texts: list[str], aggregation_strategy: str, ignore_labels: list[str] | None,
                             truncate: bool, deadline: float | None) -> TokenClassifyResult:
        if self.task != "token-classify":
            raise self._not("token-classify")
        strategy = check_strategy(aggregation_strategy)
        if not texts:
            raise ServingError.invalid("texts", "at least one text is required")
        ignore = list(DEFAULT_IGNORE) if ignore_labels is None else list(ignore_labels)
        limits = self.runtime.admission
        check_rows("texts", len(texts), limits)
        rows = await self._encode([(t, None) for t in texts], truncate, "texts", "")
        # At most one entity per token, each with its label, token text and numbers: bounded before compute.
        tokens = sum(len(r.ids) for r in rows)
        check_response_bytes(tokens * (self._label_bytes + 64) + sum(len(t.encode()) for t in texts), limits, "texts")
        # Its encodings, logits and (at worst) one entity per token, held until the answer is sent.
        check_request_memory("texts", tokens, ENCODED_TOKEN_BYTES + 4 * len(self.manifest.labels) + ENTITY_BYTES,
                             limits)
        logits = await self._logits(rows, deadline)
        if tokens <= INLINE_TOKENS:
            results = self._token_rows(texts, rows, logits, strategy, ignore)
        else:   # thousands of tokens of Python work: off the event loop
            results = await asyncio.get_running_loop().run_in_executor(
                None, self._token_rows, texts, rows, logits, strategy, ignore)
        return TokenClassifyResult(model=self.name, version=self.version, results=results,
                                   labels=list(self.manifest.labels), aggregation_strategy=strategy)
