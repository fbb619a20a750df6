"""ortserve.v1.TaskService (protos/ortserve.proto): protobuf <-> data-plane calls."""
from __future__ import annotations

import asyncio
import threading
from typing import Any, AsyncIterator

import grpc

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc
from server.protocol.errors import Code, ServingError
from server.encoders.token_aggregation import INLINE_ENTITIES
from server.generation import GeneratedToken, GenerationParams, Usage
from server.grpc.common import Instrumented, deadline_of, streaming, unary
from server.grpc.task_messages import (rerank_pairs, rerank_to_proto, token_classify_encoded,
                                       token_classify_to_proto, tokenized_to_proto, top_n, zero_shot_request,
                                       zero_shot_to_proto)
from server.protocol.types import ModelStatus, StreamPart
from server.structured import Constraint, constraint_of

FINISH_REASONS = {"length": pb.FINISH_REASON_LENGTH, "eos": pb.FINISH_REASON_EOS, "stop": pb.FINISH_REASON_STOP,
                  "cancelled": pb.FINISH_REASON_CANCELLED}
_OPTIONAL = ("max_new_tokens", "temperature", "top_p", "repetition_penalty", "seed", "prompt_logprobs", "num_beams",
             "length_penalty", "stream_interval")
_EARLY_STOPPING = {"": None, "false": False, "true": True, "never": "never"}


def params_from_proto(request: pb.GenerateRequest) -> GenerationParams:
    """GenerationParameters -> validated GenerationParams (unset optional fields take the defaults).

    Clients send the same parameters request after request (a batch job's, a service's fixed settings), and
    validating them costs the event loop more than parsing them: a message of at most _CACHED_BYTES is validated
    once and then answered by its bytes (GenerationParams is frozen, so requests share it). A refusal is never
    cached; a request with a constraint is validated each time (its grammar object is the request's own)."""
    if request.HasField("constraint"):
        return _validated(request.parameters, request.target_language, request.source_language, request)
    key = request.parameters.SerializeToString(deterministic=True)
    if len(key) > _CACHED_BYTES:
        return _validated(request.parameters, request.target_language, request.source_language)
    languages = (request.target_language, request.source_language)
    found = _PARAMS.get(key, languages)
    if found is None:
        found = _validated(request.parameters, *languages)
        _PARAMS.put(key, languages, found)
    return found


class _ParamsCache:
    """The last `size` validated messages, by their bytes and languages (oldest out first): a miss costs the
    serialization beside the validation, a hit neither parsing nor validation. Doors may call from threads."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: dict[tuple[bytes, str, str], GenerationParams] = {}
        self._lock = threading.Lock()

    def get(self, key: bytes, languages: tuple[str, str]) -> GenerationParams | None:
        return self._entries.get((key, *languages))

    def put(self, key: bytes, languages: tuple[str, str], params: GenerationParams) -> None:
        with self._lock:
            if len(self._entries) >= self._size:
                del self._entries[next(iter(self._entries))]
            self._entries[(key, *languages)] = params


_CACHED_BYTES = 1024
_PARAMS = _ParamsCache(256)


def _validated(p: pb.GenerationParameters, target_language: str, source_language: str,
               constrained: pb.GenerateRequest | None = None) -> GenerationParams:
    """The parameters checked; `constrained`: the request whose constraint they carry."""
    fields: dict[str, Any] = {name: getattr(p, name) for name in _OPTIONAL if p.HasField(name)}
    fields.update(top_k=p.top_k, stop=list(p.stop), stop_token_ids=list(p.stop_token_ids), logprobs=p.logprobs,
                  top_logprobs=p.top_logprobs, truncate_prompt=p.truncate_prompt, ignore_eos=p.ignore_eos,
                  presence_penalty=p.presence_penalty, frequency_penalty=p.frequency_penalty,
                  logit_bias=dict(p.logit_bias), min_p=p.min_p, min_tokens=p.min_tokens)
    if p.early_stopping not in _EARLY_STOPPING:
        raise ServingError.invalid("parameters.early_stopping", f"must be \"\", \"true\", \"false\" or \"never\", got "
                                                                f"{p.early_stopping[:40]!r}")
    fields["early_stopping"] = _EARLY_STOPPING[p.early_stopping]
    fields.update(target_language=target_language, source_language=source_language)
    try:
        fields["constraint"] = None if constrained is None else constraint_from_proto(constrained)
        return GenerationParams.validate(**fields)
    except ValueError as exc:
        raise ServingError(Code.INVALID_ARGUMENT, str(exc)) from None


def constraint_from_proto(request: pb.GenerateRequest) -> Constraint | None:
    """GenerateRequest.constraint -> a checked Constraint naming constraint.<kind> (ValueError), None when unset."""
    if not request.HasField("constraint"):
        return None
    kind = request.constraint.WhichOneof("kind")
    if kind is None:
        raise ValueError("constraint: set one of json_schema, regex, choice or grammar")
    value = getattr(request.constraint, kind)
    return constraint_of(kind, list(value.options) if kind == "choice" else value, f"constraint.{kind}")


def prompt_from_proto(request: pb.GenerateRequest) -> str | list[int]:
    """The text prompt, or its token ids (prompt_ids); not both."""
    if not request.prompt_ids:
        return request.prompt
    if request.prompt:
        raise ServingError.invalid("prompt_ids", "give prompt or prompt_ids, not both")
    return list(request.prompt_ids)


def tokens_to_proto(tokens: list[GeneratedToken]) -> list[pb.GeneratedToken]:
    out = []
    for t in tokens:
        if t.logprob is None and not t.token and not t.top_logprobs:    # most tokens: the id alone
            out.append(pb.GeneratedToken(token_id=t.token_id))
            continue
        msg = pb.GeneratedToken(token_id=t.token_id, logprob=t.logprob or 0.0, token=t.token)
        msg.top_logprobs.extend(pb.TokenLogprob(token_id=a.token_id, token=a.token, logprob=a.logprob)
                                for a in t.top_logprobs)
        out.append(msg)
    return out


def usage_to_proto(usage: Usage) -> pb.Usage:
    return pb.Usage(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                    cached_prompt_tokens=usage.cached_prompt_tokens)


def chunk_to_proto(model: str, part: StreamPart) -> pb.GenerateStreamResponse:
    chunk = part.chunk
    message = pb.GenerateStreamResponse(text=chunk.text, tokens=tokens_to_proto(chunk.tokens), final=chunk.final,
                                        model=model, version=part.version,
                                        prompt_tokens=tokens_to_proto(chunk.prompt_tokens))
    if chunk.final:
        message.finish_reason = FINISH_REASONS[chunk.finish_reason or "length"]
        if chunk.usage is not None:
            message.usage.CopyFrom(usage_to_proto(chunk.usage))
    return message


def status_to_proto(s: ModelStatus) -> pb.ModelStatus:
    return pb.ModelStatus(name=s.name, version=s.version, task=s.task, state=s.state.value, reason=s.reason,
                          variant=s.variant)


class TaskServicer(Instrumented, pb_grpc.TaskServiceServicer):
    @unary("Classify")
    async def Classify(self, request: pb.ClassifyRequest, context: grpc.aio.ServicerContext) -> pb.ClassifyResponse:
        inputs = [(i.text, i.text_pair or None) for i in request.inputs]
        result = await self.plane.classify(request.model, request.version, inputs, request.top_k, request.truncate,
                                           deadline_of(context), request.function_to_apply or None)
        response = pb.ClassifyResponse(model=result.model, version=result.version)
        for r in result.results:
            item = response.results.add(label=r.label, score=r.score)
            item.scores.extend(pb.LabelScore(label=s.label, score=s.score) for s in r.scores)
        return response

    @unary("FillMask")
    async def FillMask(self, request: pb.FillMaskRequest, context: grpc.aio.ServicerContext) -> pb.FillMaskResponse:
        result = await self.plane.fill_mask(request.model, request.version, list(request.texts), request.top_k,
                                            request.truncate, deadline_of(context))
        response = pb.FillMaskResponse(model=result.model, version=result.version)
        for masks in result.results:
            text = response.results.add()
            for m in masks:
                mask = text.masks.add(position=m.position)
                mask.candidates.extend(pb.TokenCandidate(token=c.token, token_id=c.token_id, score=c.score,
                                                         sequence=c.sequence) for c in m.candidates)
        return response

    @unary("Generate")
    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> pb.GenerateResponse:
        result = await self.plane.generate(request.model, request.version, prompt_from_proto(request),
                                           params_from_proto(request), deadline_of(context))
        r = result.output
        return pb.GenerateResponse(
            model=request.model, version=result.version, text=r.text, finish_reason=FINISH_REASONS[r.finish_reason],
            usage=usage_to_proto(r.usage),
            tokens=tokens_to_proto(r.tokens), time_to_first_token_ms=r.time_to_first_token_ms,
            total_time_ms=r.total_time_ms, prompt_tokens=tokens_to_proto(r.prompt_tokens))

    @streaming("GenerateStream")
    async def GenerateStream(self, request: pb.GenerateRequest,
                             context: grpc.aio.ServicerContext) -> AsyncIterator[pb.GenerateStreamResponse]:
        stream = await self.plane.generate_stream(request.model, request.version, prompt_from_proto(request),
                                                  params_from_proto(request), deadline_of(context))
        try:
            async for part in stream:
                yield chunk_to_proto(request.model, part)
        finally:
            await stream.aclose()  # a cancelled call frees the sequence's slot now, not at garbage collection

    @unary("Embed")
    async def Embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> pb.EmbedResponse:
        result = await self.plane.embed(request.model, request.version, list(request.texts), request.truncate,
                                        deadline_of(context),
                                        request.dimensions if request.HasField("dimensions") else None,
                                        request.prompt_name if request.HasField("prompt_name") else None)
        return pb.EmbedResponse(
            model=request.model, version=result.version, dimension=int(result.embeddings.shape[1]),
            normalized=result.normalized,
            embeddings=[pb.Embedding(values=row.tolist(), tokens=n)
                        for row, n in zip(result.embeddings, result.token_counts)])

    @unary("TokenClassify")
    async def TokenClassify(self, request: pb.TokenClassifyRequest,
                            context: grpc.aio.ServicerContext) -> pb.TokenClassifyResponse | bytes:
        if request.keep_all_labels and request.ignore_labels:
            raise ServingError.invalid("keep_all_labels", "give ignore_labels or keep_all_labels, not both")
        ignore = [] if request.keep_all_labels else (list(request.ignore_labels) or None)
        result = await self.plane.token_classify(request.model, request.version, list(request.texts),
                                                 request.aggregation_strategy or "none", ignore, request.truncate,
                                                 deadline_of(context))
        if sum(len(entities) for entities in result.results) <= INLINE_ENTITIES:
            return token_classify_to_proto(result)
        return await asyncio.get_running_loop().run_in_executor(None, token_classify_encoded, result)  # bytes

    @unary("ListModels", model_field="")
    async def ListModels(self, request: pb.ListModelsRequest,
                         context: grpc.aio.ServicerContext) -> pb.ListModelsResponse:
        return pb.ListModelsResponse(models=[status_to_proto(s) for s in self.plane.list_models()])

    @unary("ModelInfo")
    async def ModelInfo(self, request: pb.ModelInfoRequest, context: grpc.aio.ServicerContext) -> pb.ModelInfoResponse:
        info = self.plane.model_info(request.model, request.version)
        return pb.ModelInfoResponse(status=status_to_proto(info.status), labels=info.labels,
                                    max_length=info.max_length, mask_token=info.mask_token, variant=info.variant,
                                    providers=info.providers, versions=info.versions,
                                    max_batch_size=info.max_batch_size, manifest_json=info.manifest_json,
                                    cache_bytes_per_slot=info.cache_bytes_per_slot, cache_bytes=info.cache_bytes)

    @unary("Tokenize")
    async def Tokenize(self, request: pb.TokenizeRequest, context: grpc.aio.ServicerContext) -> pb.TokenizeResponse:
        return tokenized_to_proto(await self.plane.tokenize(request.model, request.version, request.prompt))

    @unary("Detokenize")
    async def Detokenize(self, request: pb.DetokenizeRequest,
                         context: grpc.aio.ServicerContext) -> pb.DetokenizeResponse:
        text = await self.plane.detokenize(request.model, request.version, list(request.tokens))
        return pb.DetokenizeResponse(model=request.model, text=text)

    @unary("Rerank")
    async def Rerank(self, request: pb.RerankRequest, context: grpc.aio.ServicerContext) -> pb.RerankResponse:
        result = await self.plane.rerank(request.model, request.version, rerank_pairs(request), top_n(request),
                                         request.truncate, request.raw_scores, deadline_of(context))
        return rerank_to_proto(request, result)

    @unary("ZeroShotClassify")
    async def ZeroShotClassify(self, request: pb.ZeroShotClassifyRequest,
                               context: grpc.aio.ServicerContext) -> pb.ZeroShotClassifyResponse:
        result = await self.plane.zero_shot_classify(request.model, request.version, zero_shot_request(request),
                                                     deadline_of(context))
        return zero_shot_to_proto(result)
