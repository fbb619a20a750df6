"""asyncio client of the ortserve task API: the same methods as OrtserveClient, awaitable."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc

from . import convert
from .channel import aio_channel, call_metadata, channel_spec
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
_UNSET: Any = object()


class AsyncOrtserveClient:
    """Awaitable client. The channel is opened on first use, inside the running event loop
    (grpc.aio channels belong to the loop they were made in). Use `async with`."""

    def __init__(self, address: str | Sequence[str], *, timeout: float | None = None, retries: int = 3,
                 backoff: Backoff | float | None = None, tls: TLSConfig | None = None,
                 token: str | None = None) -> None:
        self.config = ClientConfig.build(address, timeout=timeout, retries=retries, backoff=backoff, tls=tls,
                                         token=token)
        self._spec = channel_spec(self.config)  # address/TLS errors surface here, not at the first call
        self._metadata = call_metadata(self.config)
        self._channel: grpc.aio.Channel | None = None
        self._tasks: ortserve_pb2_grpc.TaskServiceStub | None = None
        self._health: health_pb2_grpc.HealthStub | None = None

    # ------------------------------------------------------------ plumbing

    def _open(self) -> None:
        if self._channel is None:
            self._channel = aio_channel(self._spec)
            self._tasks = ortserve_pb2_grpc.TaskServiceStub(self._channel)
            self._health = health_pb2_grpc.HealthStub(self._channel)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def __aenter__(self) -> "AsyncOrtserveClient":
        self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _deadline(self, timeout: float | None) -> Deadline:
        return Deadline(self.config.timeout if timeout is _UNSET else timeout)

    async def _unary(self, method_name: str, request: Any, timeout: float | None, health: bool = False) -> Any:
        self._open()
        method = getattr(self._health if health else self._tasks, method_name)
        deadline = self._deadline(timeout)
        attempt = 0
        last: OrtserveError | None = None
        while True:
            left = deadline.remaining()
            if left is not None and left <= 0:
                raise deadline_error(attempt, last)
            try:
                return await method(request, timeout=left, metadata=self._metadata)
            except grpc.RpcError as e:
                last = OrtserveError.from_rpc_error(e)
            if not should_retry(last, attempt, self.config.retries):
                raise last
            delay = deadline.wait_time(backoff_delay(self.config.backoff, attempt))
            log.info("retrying after %s (attempt %d of %d, waiting %.2fs)", last, attempt + 1,
                     self.config.retries, delay)
            await asyncio.sleep(delay)
            attempt += 1

    # ------------------------------------------------------------ tasks

    async def classify(self, texts: convert.ClassifyInput | Sequence[convert.ClassifyInput], model: str,
                       version: int | None = None, top_k: int = 0, truncate: bool = False, *,
                       timeout: float | None = _UNSET) -> list[Classification]:
        request = convert.classify_request(texts, model, version, top_k, truncate)
        return convert.classifications(await self._unary("Classify", request, timeout))

    async def fill_mask(self, texts: str | Sequence[str], model: str, version: int | None = None, top_k: int = 5,
                        truncate: bool = False, *, timeout: float | None = _UNSET) -> list[FillMaskResult]:
        request = convert.fill_mask_request(texts, model, version, top_k, truncate)
        return convert.fill_mask_results(await self._unary("FillMask", request, timeout))

    async def embed(self, texts: str | Sequence[str], model: str, version: int | None = None,
                    truncate: bool = False, *, dimensions: int | None = None,
                    timeout: float | None = _UNSET) -> list[Embedding]:
        request = convert.embed_request(texts, model, version, truncate, dimensions)
        return convert.embeddings(await self._unary("Embed", request, timeout))

    async def tokenize(self, text: str, model: str, version: int | None = None, *,
                       timeout: float | None = _UNSET) -> Tokenization:
        request = convert.tokenize_request(text, model, version)
        return convert.tokenization(await self._unary("Tokenize", request, timeout))

    async def detokenize(self, ids: Sequence[int], model: str, version: int | None = None, *,
                         timeout: float | None = _UNSET) -> str:
        request = convert.detokenize_request(ids, model, version)
        return (await self._unary("Detokenize", request, timeout)).text

    async def rerank(self, query: str, documents: Sequence[str], model: str, version: int | None = None, *,
                     top_n: int | None = None, truncate: bool = False, raw_scores: bool = False,
                     return_documents: bool = False, timeout: float | None = _UNSET) -> list[RankedDocument]:
        request = convert.rerank_request(query, documents, model, version, top_n, truncate, raw_scores,
                                         return_documents)
        return convert.ranked(await self._unary("Rerank", request, timeout))

    async def token_classify(self, texts: str | Sequence[str], model: str, version: int | None = None,
                             aggregation_strategy: str = "none", ignore_labels: Sequence[str] | None = None,
                             truncate: bool = False, *, timeout: float | None = _UNSET) -> list[list[TokenEntity]]:
        request = convert.token_classify_request(texts, model, version, aggregation_strategy, ignore_labels, truncate)
        return convert.token_entities(await self._unary("TokenClassify", request, timeout))

    async def generate(self, prompt: str | Sequence[int], model: str, version: int | None = None, *,
                       timeout: float | None = _UNSET, **params: Any) -> Generation:
        gen = GenerationParams.from_kwargs(params)
        request = convert.generate_request(prompt, model, version, gen)
        return convert.generation(await self._unary("Generate", request, timeout), gen.wants_logprobs)

    def generate_stream(self, prompt: str | Sequence[int], model: str, version: int | None = None, *,
                        timeout: float | None = _UNSET, **params: Any) -> AsyncIterator[StreamChunk]:
        """`async for chunk in client.generate_stream(...)`; retried only before the first chunk."""
        gen = GenerationParams.from_kwargs(params)  # bad arguments fail here, synchronously
        request = convert.generate_request(prompt, model, version, gen)
        return self._stream(request, gen.wants_logprobs, self._deadline(timeout))

    async def _stream(self, request: pb.GenerateRequest, logprobs: bool,
                      deadline: Deadline) -> AsyncIterator[StreamChunk]:
        self._open()
        attempt = 0
        last: OrtserveError | None = None
        while True:
            left = deadline.remaining()
            if left is not None and left <= 0:
                raise deadline_error(attempt, last)
            call = self._tasks.GenerateStream(request, timeout=left, metadata=self._metadata)
            try:
                first = await call.read()
                break
            except grpc.RpcError as e:
                last = OrtserveError.from_rpc_error(e)
            if not should_retry(last, attempt, self.config.retries):
                raise last
            delay = deadline.wait_time(backoff_delay(self.config.backoff, attempt))
            log.info("retrying stream after %s (attempt %d of %d)", last, attempt + 1, self.config.retries)
            await asyncio.sleep(delay)
            attempt += 1
        try:
            message = first
            while message is not grpc.aio.EOF:
                yield convert.stream_chunk(message, logprobs)
                message = await call.read()
        except grpc.RpcError as e:
            raise OrtserveError.from_rpc_error(e) from None
        finally:
            call.cancel()  # no-op once finished; stops generation if the caller left early

    # ------------------------------------------------------------ models

    async def list_models(self, *, timeout: float | None = _UNSET) -> list[ModelStatus]:
        response = await self._unary("ListModels", pb.ListModelsRequest(), timeout)
        return [convert.model_status(m) for m in response.models]

    async def model_info(self, model: str, version: int | None = None, *,
                         timeout: float | None = _UNSET) -> ModelInfo:
        request = pb.ModelInfoRequest(model=model, version=version or 0)
        return convert.model_info(await self._unary("ModelInfo", request, timeout))

    async def health(self, model: str = "", *, timeout: float | None = _UNSET) -> str:
        request = health_pb2.HealthCheckRequest(service=model)
        response = await self._unary("Check", request, timeout, health=True)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
