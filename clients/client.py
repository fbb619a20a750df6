"""Synchronous client of the ortserve task API."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc

from . import convert
from .channel import call_metadata, channel_spec, sync_channel
from .config import Backoff, ClientConfig, TLSConfig
from .errors import OrtserveError
from .retry import Deadline, backoff_delay, deadline_error, should_retry
from .types import (
    Classification,
    Embedding,
    FillMaskResult,
    Generation,
    GenerationParams,
    ModelInfo,
    ModelStatus,
    RankedDocument,
    StreamChunk,
    Tokenization,
    TokenEntity,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
_UNSET: Any = object()


class OrtserveClient:
    """Blocking client; thread-safe (one channel, shared by all calls). Use as a context manager."""

    def __init__(self, address: str | Sequence[str], *, timeout: float | None = None, retries: int = 3,
                 backoff: Backoff | float | None = None, tls: TLSConfig | None = None,
                 token: str | None = None) -> None:
        self.config = ClientConfig.build(address, timeout=timeout, retries=retries, backoff=backoff, tls=tls,
                                         token=token)
        self._metadata = call_metadata(self.config)
        self._channel = sync_channel(channel_spec(self.config))
        self._tasks = ortserve_pb2_grpc.TaskServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    # ------------------------------------------------------------ plumbing

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "OrtserveClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _deadline(self, timeout: float | None) -> Deadline:
        return Deadline(self.config.timeout if timeout is _UNSET else timeout)

    def _unary(self, method: Callable[..., T], request: Any, timeout: float | None) -> T:
        """One logical call: attempts until an answer, a non-retryable error, or the deadline."""
        deadline = self._deadline(timeout)
        attempt = 0
        last: OrtserveError | None = None
        while True:
            left = deadline.remaining()
            if left is not None and left <= 0:
                raise deadline_error(attempt, last)
            try:
                return method(request, timeout=left, metadata=self._metadata)
            except grpc.RpcError as e:
                last = OrtserveError.from_rpc_error(e)
            if not should_retry(last, attempt, self.config.retries):
                raise last
            delay = deadline.wait_time(backoff_delay(self.config.backoff, attempt))
            log.info("retrying after %s (attempt %d of %d, waiting %.2fs)", last, attempt + 1,
                     self.config.retries, delay)
            time.sleep(delay)
            attempt += 1

    # ------------------------------------------------------------ tasks

    def classify(self, texts: convert.ClassifyInput | Sequence[convert.ClassifyInput], model: str,
                 version: int | None = None, top_k: int = 0, truncate: bool = False, *,
                 timeout: float | None = _UNSET) -> list[Classification]:
        """One Classification per text (or (text, pair) tuple), in order."""
        request = convert.classify_request(texts, model, version, top_k, truncate)
        return convert.classifications(self._unary(self._tasks.Classify, request, timeout))

    def fill_mask(self, texts: str | Sequence[str], model: str, version: int | None = None, top_k: int = 5,
                  truncate: bool = False, *, timeout: float | None = _UNSET) -> list[FillMaskResult]:
        request = convert.fill_mask_request(texts, model, version, top_k, truncate)
        return convert.fill_mask_results(self._unary(self._tasks.FillMask, request, timeout))

    def embed(self, texts: str | Sequence[str], model: str, version: int | None = None, truncate: bool = False, *,
              dimensions: int | None = None, timeout: float | None = _UNSET) -> list[Embedding]:
        """One Embedding per text, in order (an embedding model: task "embed"). dimensions: Matryoshka
        shortening, for models whose package declares it."""
        request = convert.embed_request(texts, model, version, truncate, dimensions)
        return convert.embeddings(self._unary(self._tasks.Embed, request, timeout))

    def tokenize(self, text: str, model: str, version: int | None = None, *,
                 timeout: float | None = _UNSET) -> Tokenization:
        """The model's tokens of `text` (any model kind), special tokens marked, with character offsets."""
        request = convert.tokenize_request(text, model, version)
        return convert.tokenization(self._unary(self._tasks.Tokenize, request, timeout))

    def detokenize(self, ids: Sequence[int], model: str, version: int | None = None, *,
                   timeout: float | None = _UNSET) -> str:
        request = convert.detokenize_request(ids, model, version)
        return self._unary(self._tasks.Detokenize, request, timeout).text

    def rerank(self, query: str, documents: Sequence[str], model: str, version: int | None = None, *,
               top_n: int | None = None, truncate: bool = False, raw_scores: bool = False,
               return_documents: bool = False, timeout: float | None = _UNSET) -> list[RankedDocument]:
        """Documents ranked by relevance to the query, best first (a cross-encoder or an embedding model)."""
        request = convert.rerank_request(query, documents, model, version, top_n, truncate, raw_scores,
                                         return_documents)
        return convert.ranked(self._unary(self._tasks.Rerank, request, timeout))

    def token_classify(self, texts: str | Sequence[str], model: str, version: int | None = None,
                       aggregation_strategy: str = "none", ignore_labels: Sequence[str] | None = None,
                       truncate: bool = False, *, timeout: float | None = _UNSET) -> list[list[TokenEntity]]:
        """Each text's entities (a token-classification model), grouped as transformers' pipeline groups them:
        aggregation_strategy none | simple | first | average | max; ignore_labels None = ["O"], [] = keep all."""
        request = convert.token_classify_request(texts, model, version, aggregation_strategy, ignore_labels, truncate)
        return convert.token_entities(self._unary(self._tasks.TokenClassify, request, timeout))

    def generate(self, prompt: str | Sequence[int], model: str, version: int | None = None, *,
                 timeout: float | None = _UNSET, **params: Any) -> Generation:
        """params: the GenerationParams fields (max_new_tokens, temperature, top_k, top_p, seed, stop, ...)."""
        gen = GenerationParams.from_kwargs(params)
        request = convert.generate_request(prompt, model, version, gen)
        return convert.generation(self._unary(self._tasks.Generate, request, timeout), gen.wants_logprobs)

    def generate_stream(self, prompt: str | Sequence[int], model: str, version: int | None = None, *,
                        timeout: float | None = _UNSET, **params: Any) -> Iterator[StreamChunk]:
        """Chunks as the server produces them; the last one has final=True.

        Retried (on UNAVAILABLE) only until the first chunk arrives: after that a retry would repeat
        text the caller has already seen. Leaving the loop early cancels the call on the server.
        """
        gen = GenerationParams.from_kwargs(params)  # bad arguments fail here, not at the first next()
        request = convert.generate_request(prompt, model, version, gen)
        return self._stream(request, gen.wants_logprobs, self._deadline(timeout))

    def _stream(self, request: pb.GenerateRequest, logprobs: bool, deadline: Deadline) -> Iterator[StreamChunk]:
        attempt = 0
        last: OrtserveError | None = None
        while True:
            left = deadline.remaining()
            if left is not None and left <= 0:
                raise deadline_error(attempt, last)
            call = self._tasks.GenerateStream(request, timeout=left, metadata=self._metadata)
            try:
                first = next(call)
                break
            except StopIteration:
                return
            except grpc.RpcError as e:
                last = OrtserveError.from_rpc_error(e)
            if not should_retry(last, attempt, self.config.retries):
                raise last
            delay = deadline.wait_time(backoff_delay(self.config.backoff, attempt))
            log.info("retrying stream after %s (attempt %d of %d)", last, attempt + 1, self.config.retries)
            time.sleep(delay)
            attempt += 1
        try:
            yield convert.stream_chunk(first, logprobs)
            for message in call:
                yield convert.stream_chunk(message, logprobs)
        except grpc.RpcError as e:
            raise OrtserveError.from_rpc_error(e) from None
        finally:
            call.cancel()  # no-op once finished; stops generation if the caller left early

    # ------------------------------------------------------------ models

    def list_models(self, *, timeout: float | None = _UNSET) -> list[ModelStatus]:
        response = self._unary(self._tasks.ListModels, pb.ListModelsRequest(), timeout)
        return [convert.model_status(m) for m in response.models]

    def model_info(self, model: str, version: int | None = None, *, timeout: float | None = _UNSET) -> ModelInfo:
        request = pb.ModelInfoRequest(model=model, version=version or 0)
        return convert.model_info(self._unary(self._tasks.ModelInfo, request, timeout))

    def health(self, model: str = "", *, timeout: float | None = _UNSET) -> str:
        """grpc.health.v1 status of the server ("") or of one model: "SERVING", "NOT_SERVING", ..."""
        response = self._unary(self._health.Check, health_pb2.HealthCheckRequest(service=model), timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
