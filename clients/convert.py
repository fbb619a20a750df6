"""Protobuf messages <-> the client's dataclasses (clients/calls.py pairs each request with its answer's converter)."""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Union

from grpc_health.v1 import health_pb2

from protos import ortserve_pb2 as pb
from protos.results import (Classification, LabelScore, MaskPrediction, TokenCandidate, TokenEntity, TokenLogprob,
                            TokenSpan, Usage, ZeroShotClassification)

from .types import (Embedding, FillMaskResult, GeneratedToken, Generation, GenerationParams, ModelInfo, ModelStatus,
                    RankedDocument, StreamChunk, Tokenization)

# A classify input: a text, or a (text, pair) tuple whose pair may be None.
ClassifyInput = Union[str, tuple[str, Union[str, None]], Sequence[str]]

_FINISH_REASONS = {
    pb.FINISH_REASON_UNSPECIFIED: "",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_EOS: "eos",
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_CANCELLED: "cancelled",
}


# ---------------------------------------------------------------- requests

def _text_input(item: ClassifyInput, index: int) -> pb.TextInput:
    if isinstance(item, str):
        return pb.TextInput(text=item)
    if isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str) \
            and (item[1] is None or isinstance(item[1], str)):
        return pb.TextInput(text=item[0], text_pair=item[1] or "")
    raise TypeError(f"texts[{index}]: expected a str or a (text, pair) tuple, got {type(item).__name__}")


def classify_request(texts: ClassifyInput | Sequence[ClassifyInput], model: str, version: int | None,
                     top_k: int, truncate: bool, function_to_apply: str | None = None) -> pb.ClassifyRequest:
    """function_to_apply: "softmax" | "sigmoid" | "none"; None = the package's activation."""
    items = [texts] if isinstance(texts, str) else list(texts)
    if function_to_apply is not None and not isinstance(function_to_apply, str):
        raise TypeError(f"function_to_apply: expected a str, got {type(function_to_apply).__name__}")
    return pb.ClassifyRequest(model=model, version=version or 0, top_k=top_k, truncate=truncate,
                              inputs=[_text_input(t, i) for i, t in enumerate(items)],
                              function_to_apply=function_to_apply or "")


def fill_mask_request(texts: str | Sequence[str], model: str, version: int | None, top_k: int,
                      truncate: bool) -> pb.FillMaskRequest:
    items = [texts] if isinstance(texts, str) else list(texts)
    for i, t in enumerate(items):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}]: expected a str, got {type(t).__name__}")
    return pb.FillMaskRequest(model=model, version=version or 0, texts=items, top_k=top_k, truncate=truncate)


def embed_request(texts: str | Sequence[str], model: str, version: int | None, truncate: bool,
                  dimensions: int | None = None, prompt_name: str | None = None) -> pb.EmbedRequest:
    items = [texts] if isinstance(texts, str) else list(texts)
    for i, t in enumerate(items):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}]: expected a str, got {type(t).__name__}")
    request = pb.EmbedRequest(model=model, version=version or 0, texts=items, truncate=truncate)
    if dimensions is not None:
        request.dimensions = dimensions
    if prompt_name is not None:
        request.prompt_name = prompt_name
    return request


def tokenize_request(text: str, model: str, version: int | None) -> pb.TokenizeRequest:
    if not isinstance(text, str):
        raise TypeError(f"text: expected a str, got {type(text).__name__}")
    return pb.TokenizeRequest(model=model, version=version or 0, prompt=text)


def tokenization(response: pb.TokenizeResponse) -> Tokenization:
    return Tokenization([TokenSpan(t.id, t.text, t.special, t.start, t.stop) for t in response.tokens],
                        response.max_length)


def detokenize_request(ids: Sequence[int], model: str, version: int | None) -> pb.DetokenizeRequest:
    return pb.DetokenizeRequest(model=model, version=version or 0, tokens=[int(i) for i in ids])


def rerank_request(query: str, documents: Sequence[str], model: str, version: int | None, top_n: int | None,
                   truncate: bool, raw_scores: bool, return_documents: bool) -> pb.RerankRequest:
    if isinstance(documents, str):
        raise TypeError("documents: expected a list of str, got one str")
    request = pb.RerankRequest(model=model, version=version or 0, query=query, documents=list(documents),
                               truncate=truncate, raw_scores=raw_scores, return_documents=return_documents)
    if top_n is not None:
        request.top_n = top_n
    return request


def ranked(response: pb.RerankResponse) -> list[RankedDocument]:
    return [RankedDocument(r.index, r.score, r.document) for r in response.results]


def embeddings(response: pb.EmbedResponse) -> list[Embedding]:
    return [Embedding(values=list(e.values), tokens=e.tokens, normalized=response.normalized)
            for e in response.embeddings]


def generation_parameters(params: GenerationParams) -> pb.GenerationParameters:
    message = pb.GenerationParameters(
        top_k=params.top_k, stop=list(params.stop), stop_token_ids=list(params.stop_token_ids),
        logprobs=params.logprobs, top_logprobs=params.top_logprobs,
        truncate_prompt=params.truncate_prompt, ignore_eos=params.ignore_eos,
        presence_penalty=params.presence_penalty, frequency_penalty=params.frequency_penalty,
        logit_bias=dict(params.logit_bias), min_p=params.min_p, min_tokens=params.min_tokens)
    # proto3 `optional` fields: leave unset (server default) unless given.
    for name in ("max_new_tokens", "temperature", "top_p", "repetition_penalty", "seed", "prompt_logprobs",
                 "num_beams", "length_penalty", "stream_interval"):
        value = getattr(params, name)
        if value is not None:
            setattr(message, name, value)
    if params.early_stopping is not None:   # the proto's string: "true", "false", "never"
        early = params.early_stopping
        message.early_stopping = ("true" if early else "false") if isinstance(early, bool) else str(early)
    return message


def generate_request(prompt: str | Sequence[int], model: str, version: int | None,
                     params: GenerationParams) -> pb.GenerateRequest:
    """A text prompt, or a sequence of token ids (sent as prompt_ids)."""
    language = params.target_language or ""
    if isinstance(prompt, str):
        return pb.GenerateRequest(model=model, version=version or 0, prompt=prompt,
                                  parameters=generation_parameters(params), target_language=language,
                                  source_language=params.source_language or "")
    if not isinstance(prompt, Sequence) or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        raise TypeError(f"prompt: expected a str or a sequence of token ids, got {type(prompt).__name__}")
    return pb.GenerateRequest(model=model, version=version or 0, prompt_ids=list(prompt),
                              parameters=generation_parameters(params), target_language=language,
                              source_language=params.source_language or "")


# ---------------------------------------------------------------- responses

def classifications(response: pb.ClassifyResponse) -> list[Classification]:
    return [Classification(label=r.label, score=r.score,
                           scores=[LabelScore(label=s.label, score=s.score) for s in r.scores])
            for r in response.results]


def fill_mask_results(response: pb.FillMaskResponse) -> list[FillMaskResult]:
    return [FillMaskResult(masks=[
        MaskPrediction(position=m.position, candidates=[
            TokenCandidate(token=c.token, token_id=c.token_id, score=c.score, sequence=c.sequence)
            for c in m.candidates])
        for m in r.masks]) for r in response.results]


def _tokens(tokens, with_logprobs: bool) -> list[GeneratedToken]:
    return [GeneratedToken(
        token_id=t.token_id, logprob=t.logprob if with_logprobs else None,
        top_logprobs=[TokenLogprob(token_id=a.token_id, token=a.token, logprob=a.logprob) for a in t.top_logprobs])
        for t in tokens]


def _prompt_tokens(tokens) -> list[GeneratedToken]:
    """The scored prompt: every token has a logprob but the first, which has no context to be scored in."""
    scored = _tokens(tokens, True)
    return [GeneratedToken(scored[0].token_id)] + scored[1:] if scored else []


def usage(message: pb.Usage) -> Usage:
    return Usage(message.prompt_tokens, message.completion_tokens, message.cached_prompt_tokens)


def generation(response: pb.GenerateResponse, with_logprobs: bool) -> Generation:
    return Generation(
        text=response.text, finish_reason=_FINISH_REASONS.get(response.finish_reason, ""),
        usage=usage(response.usage),
        tokens=_tokens(response.tokens, with_logprobs), model=response.model, version=response.version,
        time_to_first_token_ms=response.time_to_first_token_ms, total_time_ms=response.total_time_ms,
        prompt_tokens=_prompt_tokens(response.prompt_tokens))


def stream_chunk(message: pb.GenerateStreamResponse, with_logprobs: bool) -> StreamChunk:
    final = message.final
    return StreamChunk(
        text=message.text, tokens=_tokens(message.tokens, with_logprobs), final=final,
        finish_reason=_FINISH_REASONS.get(message.finish_reason, "") if final else None,
        usage=usage(message.usage) if final else None,
        model=message.model, version=message.version, prompt_tokens=_prompt_tokens(message.prompt_tokens))


def model_status(message: pb.ModelStatus) -> ModelStatus:
    return ModelStatus(name=message.name, version=message.version, task=message.task, state=message.state,
                       reason=message.reason, variant=message.variant)


def model_statuses(response: pb.ListModelsResponse) -> list[ModelStatus]:
    return [model_status(m) for m in response.models]


def model_info(response: pb.ModelInfoResponse) -> ModelInfo:
    try:
        manifest = json.loads(response.manifest_json) if response.manifest_json else {}
    except ValueError:  # the server sends it verbatim; a broken one should not break the call
        manifest = {}
    return ModelInfo(
        status=model_status(response.status), labels=list(response.labels), max_length=response.max_length,
        mask_token=response.mask_token, variant=response.variant, providers=list(response.providers),
        versions=list(response.versions), max_batch_size=response.max_batch_size, manifest=manifest,
        cache_bytes_per_slot=response.cache_bytes_per_slot, cache_bytes=response.cache_bytes)


def token_classify_request(texts: str | Sequence[str], model: str, version: int | None, aggregation_strategy: str,
                           ignore_labels: Sequence[str] | None, truncate: bool) -> pb.TokenClassifyRequest:
    """ignore_labels None: the server's default (["O"]); an empty list keeps every label."""
    items = [texts] if isinstance(texts, str) else list(texts)
    for i, t in enumerate(items):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}]: expected a str, got {type(t).__name__}")
    ignore = list(ignore_labels) if ignore_labels is not None else []
    return pb.TokenClassifyRequest(model=model, version=version or 0, texts=items,
                                   aggregation_strategy=aggregation_strategy, ignore_labels=ignore,
                                   keep_all_labels=ignore_labels is not None and not ignore, truncate=truncate)


def zero_shot_request(texts: str | Sequence[str], candidate_labels: str | Sequence[str], model: str,
                      version: int | None, hypothesis_template: str | None, multi_label: bool,
                      truncate: bool) -> pb.ZeroShotClassifyRequest:
    """candidate_labels: a list, or one comma-separated string (split as transformers' pipeline splits it)."""
    items = [texts] if isinstance(texts, str) else list(texts)
    labels = ([label.strip() for label in candidate_labels.split(",") if label.strip()]
              if isinstance(candidate_labels, str) else list(candidate_labels))
    for name, values in (("texts", items), ("candidate_labels", labels)):
        for i, t in enumerate(values):
            if not isinstance(t, str):
                raise TypeError(f"{name}[{i}]: expected a str, got {type(t).__name__}")
    return pb.ZeroShotClassifyRequest(model=model, version=version or 0, texts=items, candidate_labels=labels,
                                      hypothesis_template=hypothesis_template or "", multi_label=multi_label,
                                      truncate=truncate)


def zero_shot_results(response: pb.ZeroShotClassifyResponse) -> list[ZeroShotClassification]:
    return [ZeroShotClassification(sequence=r.sequence, labels=list(r.labels), scores=list(r.scores))
            for r in response.results]


def token_entities(response: pb.TokenClassifyResponse) -> list[list[TokenEntity]]:
    return [[TokenEntity(label=e.label, score=e.score, word=e.word, start=e.start, end=e.end,
                         index=None if e.index < 0 else e.index) for e in r.entities] for r in response.results]


def serving_status(response: health_pb2.HealthCheckResponse) -> str:
    """grpc.health.v1's status by name: "SERVING", "NOT_SERVING", ..."""
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
