"""The task API's methods, written once for both clients.

Each method hands its call (clients/calls.py) to the client's transport: OrtserveClient (clients/client.py) makes
it at once and returns the result; AsyncOrtserveClient (clients/aio.py) returns an awaitable of the same result,
and from generate_stream an async iterator. A call is built inside the transport (for the asyncio client: when
awaited), so bad arguments fail where they always did; generate_stream builds its call at once in both.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from . import calls, convert
from .channel import call_metadata, channel_spec
from .config import Backoff, ClientConfig, TLSConfig
from .retry import Attempts
from .types import (Classification, Embedding, FillMaskResult, Generation, ModelInfo, ModelStatus, RankedDocument,
                    StreamChunk, Tokenization, TokenEntity, ZeroShotClassification)

_UNSET: Any = object()   # timeout not given: the client's default


class TaskMethods(ABC):
    """Connection settings and the task API's methods; a subclass supplies the transport."""

    def __init__(self, address: str | Sequence[str], *, timeout: float | None = None, retries: int = 3,
                 backoff: Backoff | float | None = None, tls: TLSConfig | None = None,
                 token: str | None = None) -> None:
        self.config = ClientConfig.build(address, timeout=timeout, retries=retries, backoff=backoff, tls=tls,
                                         token=token)
        self._spec = channel_spec(self.config)  # address/TLS errors surface here, not at the first call
        self._metadata = call_metadata(self.config)
        self._connect()

    # ------------------------------------------------------------ transport

    @abstractmethod
    def _connect(self) -> None:
        """Called at the end of __init__: open the channel now, or make ready to open it on first use."""

    @abstractmethod
    def _unary(self, timeout: float | None, build: Callable[..., calls.Call[Any]], *args: Any) -> Any:
        """Make the call `build(*args)` (attempted until an answer, a non-retryable error or the deadline)."""

    @abstractmethod
    def _stream(self, call: calls.Call[StreamChunk], attempts: Attempts) -> Any:
        """The call's responses as they arrive (retried only until the first one)."""

    def _attempts(self, timeout: float | None, what: str) -> Attempts:
        return Attempts(self.config, self.config.timeout if timeout is _UNSET else timeout, what)

    # ------------------------------------------------------------ tasks

    def classify(self, texts: convert.ClassifyInput | Sequence[convert.ClassifyInput], model: str,
                 version: int | None = None, top_k: int = 0, truncate: bool = False, *,
                 function_to_apply: str | None = None, timeout: float | None = _UNSET) -> list[Classification]:
        """One Classification per text (or (text, pair) tuple), in order. function_to_apply: "softmax",
        "sigmoid" or "none" (the logits); None = the activation the package records for its head."""
        return self._unary(timeout, calls.classify, texts, model, version, top_k, truncate, function_to_apply)

    def fill_mask(self, texts: str | Sequence[str], model: str, version: int | None = None, top_k: int = 5,
                  truncate: bool = False, *, timeout: float | None = _UNSET) -> list[FillMaskResult]:
        return self._unary(timeout, calls.fill_mask, texts, model, version, top_k, truncate)

    def embed(self, texts: str | Sequence[str], model: str, version: int | None = None, truncate: bool = False, *,
              dimensions: int | None = None, prompt_name: str | None = None,
              timeout: float | None = _UNSET) -> list[Embedding]:
        """One Embedding per text, in order (an embedding model: task "embed"). dimensions: Matryoshka
        shortening, for models whose package declares it; prompt_name: one of the model's prompts (else its
        default)."""
        return self._unary(timeout, calls.embed, texts, model, version, truncate, dimensions, prompt_name)

    def tokenize(self, text: str, model: str, version: int | None = None, *,
                 timeout: float | None = _UNSET) -> Tokenization:
        """The model's tokens of `text` (any model kind), special tokens marked, with character offsets."""
        return self._unary(timeout, calls.tokenize, text, model, version)

    def detokenize(self, ids: Sequence[int], model: str, version: int | None = None, *,
                   timeout: float | None = _UNSET) -> str:
        return self._unary(timeout, calls.detokenize, ids, model, version)

    def rerank(self, query: str, documents: Sequence[str], model: str, version: int | None = None, *,
               top_n: int | None = None, truncate: bool = False, raw_scores: bool = False,
               return_documents: bool = False, timeout: float | None = _UNSET) -> list[RankedDocument]:
        """Documents ranked by relevance to the query, best first (a cross-encoder or an embedding model)."""
        return self._unary(timeout, calls.rerank, query, documents, model, version, top_n, truncate, raw_scores,
                           return_documents)

    def token_classify(self, texts: str | Sequence[str], model: str, version: int | None = None,
                       aggregation_strategy: str = "none", ignore_labels: Sequence[str] | None = None,
                       truncate: bool = False, *, timeout: float | None = _UNSET) -> list[list[TokenEntity]]:
        """Each text's entities (a token-classification model), grouped as transformers' pipeline groups them:
        aggregation_strategy none | simple | first | average | max; ignore_labels None = ["O"], [] = keep all."""
        return self._unary(timeout, calls.token_classify, texts, model, version, aggregation_strategy,
                           ignore_labels, truncate)

    def zero_shot_classify(self, texts: str | Sequence[str], candidate_labels: Sequence[str], model: str,
                           version: int | None = None, *, hypothesis_template: str | None = None,
                           multi_label: bool = False, truncate: bool = False,
                           timeout: float | None = _UNSET) -> list[ZeroShotClassification]:
        """Each text's candidate labels, best first with their scores, by an NLI model (as transformers'
        zero-shot-classification pipeline answers); hypothesis_template None = "This example is {}."."""
        return self._unary(timeout, calls.zero_shot_classify, texts, candidate_labels, model, version,
                           hypothesis_template, multi_label, truncate)

    def generate(self, prompt: str | Sequence[int], model: str, version: int | None = None, *,
                 timeout: float | None = _UNSET, **params: Any) -> Generation:
        """params: the GenerationParams fields (max_new_tokens, temperature, top_k, top_p, seed, stop, ...)."""
        return self._unary(timeout, calls.generate, prompt, model, version, params)

    def generate_stream(self, prompt: str | Sequence[int], model: str, version: int | None = None, *,
                        timeout: float | None = _UNSET, **params: Any) -> Iterator[StreamChunk]:
        """Chunks as the server produces them (`for`, or `async for` with the asyncio client); the last one has
        final=True.

        Retried (on UNAVAILABLE) only until the first chunk arrives: after that a retry would repeat
        text the caller has already seen. Leaving the loop early cancels the call on the server.
        """
        call = calls.generate_stream(prompt, model, version, params)  # bad arguments fail here, not at the first next()
        return self._stream(call, self._attempts(timeout, "stream"))

    # ------------------------------------------------------------ models

    def list_models(self, *, timeout: float | None = _UNSET) -> list[ModelStatus]:
        return self._unary(timeout, calls.list_models)

    def model_info(self, model: str, version: int | None = None, *, timeout: float | None = _UNSET) -> ModelInfo:
        return self._unary(timeout, calls.model_info, model, version)

    def health(self, model: str = "", *, timeout: float | None = _UNSET) -> str:
        """grpc.health.v1 status of the server ("") or of one model: "SERVING", "NOT_SERVING", ..."""
        return self._unary(timeout, calls.health, model)
