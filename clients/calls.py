"""Each method of the task API as one RPC to make: which, with what request, and how its answer becomes the result.

Shared by the sync and asyncio clients (clients/methods.py): only how the RPC is made, attempted and awaited
differs between them (clients/client.py, clients/aio.py). Building a call checks the caller's arguments
(TypeError naming the bad one); protobuf <-> dataclass conversion itself is clients/convert.py.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from typing import Any, Generic, TypeVar

from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc

from . import convert
from .types import (Classification, Embedding, FillMaskResult, Generation, GenerationParams, ModelInfo,
                    ModelStatus, RankedDocument, StreamChunk, Tokenization, TokenEntity, ZeroShotClassification)

T = TypeVar("T")


@dataclass(frozen=True)
class Call(Generic[T]):
    rpc: str                      # the stub's method: "Classify", "GenerateStream", "Check", ...
    request: Any                  # its request message
    result: Callable[[Any], T]    # a response message -> the caller's result (a stream's: each message's)
    service: str = "tasks"        # whose stub: "tasks" (ortserve.v1.TaskService) or "health" (grpc.health.v1)


@dataclass(frozen=True)
class Stubs:
    """The two services' stubs on one channel (grpc's sync and aio channels take the same stub classes)."""

    tasks: ortserve_pb2_grpc.TaskServiceStub
    health: health_pb2_grpc.HealthStub

    @classmethod
    def on(cls, channel: Any) -> "Stubs":
        return cls(ortserve_pb2_grpc.TaskServiceStub(channel), health_pb2_grpc.HealthStub(channel))

    def method(self, call: Call[Any]) -> Callable[..., Any]:
        return getattr(getattr(self, call.service), call.rpc)


def classify(texts: convert.ClassifyInput | Sequence[convert.ClassifyInput], model: str, version: int | None,
             top_k: int, truncate: bool, function_to_apply: str | None = None) -> Call[list[Classification]]:
    return Call("Classify", convert.classify_request(texts, model, version, top_k, truncate, function_to_apply),
                convert.classifications)


def fill_mask(texts: str | Sequence[str], model: str, version: int | None, top_k: int,
              truncate: bool) -> Call[list[FillMaskResult]]:
    return Call("FillMask", convert.fill_mask_request(texts, model, version, top_k, truncate),
                convert.fill_mask_results)


def embed(texts: str | Sequence[str], model: str, version: int | None, truncate: bool,
          dimensions: int | None, prompt_name: str | None = None) -> Call[list[Embedding]]:
    return Call("Embed", convert.embed_request(texts, model, version, truncate, dimensions, prompt_name),
                convert.embeddings)


def tokenize(text: str, model: str, version: int | None) -> Call[Tokenization]:
    return Call("Tokenize", convert.tokenize_request(text, model, version), convert.tokenization)


def detokenize(ids: Sequence[int], model: str, version: int | None) -> Call[str]:
    return Call("Detokenize", convert.detokenize_request(ids, model, version), attrgetter("text"))


def rerank(query: str, documents: Sequence[str], model: str, version: int | None, top_n: int | None,
           truncate: bool, raw_scores: bool, return_documents: bool) -> Call[list[RankedDocument]]:
    request = convert.rerank_request(query, documents, model, version, top_n, truncate, raw_scores,
                                     return_documents)
    return Call("Rerank", request, convert.ranked)


def token_classify(texts: str | Sequence[str], model: str, version: int | None, aggregation_strategy: str,
                   ignore_labels: Sequence[str] | None, truncate: bool) -> Call[list[list[TokenEntity]]]:
    request = convert.token_classify_request(texts, model, version, aggregation_strategy, ignore_labels, truncate)
    return Call("TokenClassify", request, convert.token_entities)


def zero_shot_classify(texts: str | Sequence[str], candidate_labels: Sequence[str], model: str, version: int | None,
                       hypothesis_template: str | None, multi_label: bool,
                       truncate: bool) -> Call[list[ZeroShotClassification]]:
    request = convert.zero_shot_request(texts, candidate_labels, model, version, hypothesis_template, multi_label,
                                        truncate)
    return Call("ZeroShotClassify", request, convert.zero_shot_results)


def generate(prompt: str | Sequence[int], model: str, version: int | None,
             params: dict[str, Any]) -> Call[Generation]:
    """params: the GenerationParams fields; an unknown one is a TypeError naming it."""
    gen = GenerationParams.from_kwargs(params)
    return Call("Generate", convert.generate_request(prompt, model, version, gen),
                partial(convert.generation, with_logprobs=gen.wants_logprobs))


def generate_stream(prompt: str | Sequence[int], model: str, version: int | None,
                    params: dict[str, Any]) -> Call[StreamChunk]:
    gen = GenerationParams.from_kwargs(params)
    return Call("GenerateStream", convert.generate_request(prompt, model, version, gen),
                partial(convert.stream_chunk, with_logprobs=gen.wants_logprobs))


def list_models() -> Call[list[ModelStatus]]:
    return Call("ListModels", pb.ListModelsRequest(), convert.model_statuses)


def model_info(model: str, version: int | None) -> Call[ModelInfo]:
    return Call("ModelInfo", pb.ModelInfoRequest(model=model, version=version or 0), convert.model_info)


def health(model: str) -> Call[str]:
    return Call("Check", health_pb2.HealthCheckRequest(service=model), convert.serving_status, service="health")
