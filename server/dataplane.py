"""The data plane: the one door. Every operation a front door needs, with typed results (server/protocol/types.py).

The front doors (server/grpc/, server/http/) and in-process callers (batch jobs, benchmarks) call these
methods and nothing below them. No gRPC here: errors are ServingError(code, message), which a front door
maps to its status codes (server/grpc/status.py for gRPC, server/http/errors.py for HTTP).

    plane = await DataPlane.start(settings)
    result = await plane.classify("genre", 0, [("To be or not to be", None)])
    await plane.close()

Versions are ints; 0 = the latest SERVING version. A door calls ONE method per request, and that method resolves
the version once: one lease (server/leases.py) from admission to the answer's end, also across the steps of a
chat request (its template, then its generation) and of a KServe ModelInfer (the version's task, then its call).
What each version runs with comes from the settings through server/runtime_config.py.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Callable

import numpy as np
from prometheus_client import generate_latest

from server.encoders.rerank import check_top_n, rank
from server.generation import GenerationParams
from server.leases import Lease, RequestStream, SharedLease, check_echo, prompt_text
from server.model import ServedModel
from server.protocol.errors import Code, ServingError
from server.protocol.kserve import TextRequest, infer_operation, select_outputs, text_outputs, text_request
from server.protocol.pairs import Pairs, RerankResult, ScoreResult
from server.protocol.zero_shot import ZeroShotRequest, ZeroShotResult
from server.protocol.types import (ClassifyResult, EmbedResult, FillMaskResult, GenerateResult, InferResult, ModelInfo,
                                   ModelMetadata, ModelState, ModelStatistics, ModelStatus, RepositoryEntry,
                                   TensorMetadata, TokenClassifyResult)
from server.repository.registry import ModelRepository
from server.repository.version import ModelVersion
from server.runtime_config import runtime_config
from server.runtime.metrics import Metrics
from server.runtime.settings import ServerSettings
from server.text.chat_template import chat_prompt
from server.text.spans import Tokenized

log = logging.getLogger(__name__)

PLATFORM = "onnxruntime_onnx"
Jobs = list[tuple[str | list[int], GenerationParams]]


def _unknown(field: str, name: str, version: int) -> ServingError:
    what = f"version {version} of " if version else ""
    return ServingError(Code.NOT_FOUND, f"{field}: unknown {what}model {name!r}")


class DataPlane:
    def __init__(self, settings: ServerSettings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.repository = ModelRepository(settings.repository, runtime_config(settings), self.metrics,
                                          drain_timeout=max(settings.grace_period, 1.0))
        self.loaded = False
        self.draining = False
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._poller: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, settings: ServerSettings, metrics: Metrics | None = None,
                    poll: bool = True) -> "DataPlane":
        """Loads the repository (the latest version of every model) and starts polling it."""
        plane = cls(settings, metrics)
        await plane.open(poll)
        return plane

    async def open(self, poll: bool = True) -> None:
        """Loads the repository; ready afterwards (models that failed are NOT_SERVING, not fatal)."""
        await self.repository.load_all()
        self.loaded = True
        if poll and self.settings.poll_interval > 0:
            self._poller = asyncio.get_running_loop().create_task(
                self.repository.poll_forever(self.settings.poll_interval), name="repository-poll")

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        await self.repository.close()

    # ------------------------------------------------------------------ server state

    @property
    def ready(self) -> bool:
        """The server as a whole: repository loaded and not draining."""
        return self.loaded and not self.draining

    def metrics_exposition(self) -> bytes:
        """Every metric of the server in Prometheus' text format (what --metrics-port serves)."""
        return generate_latest(self.metrics.registry)

    @property
    def max_bytes_elements(self) -> int:
        """Elements of one KServe BYTES tensor: each is a text, one row of a request (no served graph takes
        BYTES), so max_rows_per_request; the doors check it before decoding any."""
        return self.settings.max_rows_per_request

    @property
    def inflight(self) -> int:
        return self._inflight

    def begin_drain(self) -> None:
        """Refuse new work (UNAVAILABLE); requests already admitted go on."""
        self.draining = True

    async def wait_idle(self, timeout: float | None) -> bool:
        """True when every admitted request finished within `timeout` seconds."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False

    def model_names(self) -> list[str]:
        """Names the server knows (loaded at least once); safe as metric label values."""
        return self.repository.names

    def record_request(self, model: str, method: str, code: str, seconds: float) -> None:
        """A front door's answered request, in the request metrics. Only names of loaded models become label
        values: arbitrary client strings would explode the metrics' cardinality."""
        self.metrics.record_request(model if self.repository.knows(model) else "", method, code, seconds)
        if log.isEnabledFor(logging.DEBUG):  # an access log at --log-level DEBUG (with request_id in JSON)
            log.debug("%s %s %s %.1f ms", method, model or "-", code, seconds * 1e3)

    def model_health(self, name: str) -> bool | None:
        """Health of one model name: True when a version serves, False when not, None for an unknown name."""
        if not self.repository.knows(name):
            return None
        version = self.repository.find(name)
        return version is not None and version.serving and not self.draining

    # ------------------------------------------------------------------ admission

    def _admit(self, name: str, version: int) -> ModelVersion:
        """Resolves and counts a request in, without awaiting (so a swap cannot slip in between)."""
        if self.draining:
            raise ServingError(Code.UNAVAILABLE, "server is shutting down")
        if not name:
            raise ServingError.invalid("model", "must name a model")
        resolved = self.repository.resolve(name, version)
        resolved.acquire()
        self._inflight += 1
        self._idle.clear()
        return resolved

    def _done(self, version: ModelVersion) -> None:
        version.release()
        self._inflight -= 1
        if self._inflight == 0:
            self._idle.set()

    def lease(self, name: str, version: int = 0, operation: str = "") -> "Lease":
        """`with plane.lease(name, version) as served:` the served model of a SERVING version, counted in flight
        (and in its statistics) while held. Admission happens here, before the `with` body runs. operation names
        the request's span (dataplane.<operation>) when tracing."""
        return Lease(self._done, self._admit(name, version), operation)

    # ------------------------------------------------------------------ tasks

    async def classify(self, model: str, version: int, inputs: list[tuple[str, str | None]], top_k: int = 0,
                       truncate: bool = False, deadline: float | None = None,
                       function_to_apply: str | None = None) -> ClassifyResult:
        with self.lease(model, version, "classify") as served:
            return await served.classify(inputs, top_k, truncate, deadline, function_to_apply)

    async def zero_shot_classify(self, model: str, version: int, request: ZeroShotRequest,
                                 deadline: float | None = None) -> ZeroShotResult:
        """Candidate labels scored by an NLI classifier as transformers' pipeline does (server/encoders/zero_shot.py)."""
        with self.lease(model, version, "zero_shot_classify") as served:
            return await served.zero_shot_classify(request, deadline)

    async def fill_mask(self, model: str, version: int, texts: list[str], top_k: int = 5, truncate: bool = False,
                        deadline: float | None = None) -> FillMaskResult:
        with self.lease(model, version, "fill_mask") as served:
            return await served.fill_mask(texts, top_k, truncate, deadline)

    async def embed(self, model: str, version: int, texts: list[str], truncate: bool = False,
                    deadline: float | None = None, dimensions: int | None = None,
                    prompt_name: str | None = None) -> EmbedResult:
        """dimensions: the vector length the caller asks for (OpenAI's; server/encoders/matryoshka.py), checked up front;
        prompt_name: one of the model's prompts (server/encoders/prompts.py), else its default."""
        with self.lease(model, version, "embed") as served:
            return await served.embed(texts, truncate, deadline, dimensions, prompt_name)

    async def score(self, model: str, version: int, pairs: Pairs, truncate: bool = False,
                    deadline: float | None = None) -> ScoreResult:
        """Each text pair's relevance, in order (server/encoders/rerank.py: a cross-encoder's or an embedding model's)."""
        with self.lease(model, version, "score") as served:
            return ScoreResult(model=served.name, version=served.version,
                               scores=await served.score(pairs, truncate, deadline))

    async def rerank(self, model: str, version: int, pairs: Pairs, top_n: int | None = None, truncate: bool = False,
                     raw_scores: bool = False, deadline: float | None = None,
                     top_n_field: str = "top_n") -> RerankResult:
        """The right texts of `pairs` ranked by relevance to their left one, best first, at most top_n."""
        check_top_n(top_n, top_n_field)
        result = await self.score(model, version, pairs, truncate, deadline)
        scores = result.scores
        return RerankResult(model=result.model, version=result.version, tokens=scores.tokens,
                            results=rank(scores.raw if raw_scores else scores.scores, top_n))

    async def token_classify(self, model: str, version: int, texts: list[str], aggregation_strategy: str = "none",
                             ignore_labels: list[str] | None = None, truncate: bool = False,
                             deadline: float | None = None) -> TokenClassifyResult:
        """Per-token labels, grouped as transformers' pipeline groups them (server/encoders/token_aggregation.py);
        ignore_labels None: the pipeline's default ["O"]."""
        with self.lease(model, version, "token_classify") as served:
            return await served.token_classify(texts, aggregation_strategy, ignore_labels, truncate, deadline)

    async def generate(self, model: str, version: int, prompt: str | list[int], params: GenerationParams,
                       deadline: float | None = None, echo: bool = False) -> GenerateResult:
        """echo: the result carries the prompt's text (what an echoing answer starts with)."""
        with self.lease(model, version, "generate") as served:
            check_echo(served, echo)
            output = await served.generate(prompt, params, deadline)
            return GenerateResult(model=served.name, version=served.version, output=output,
                                  prompt_text=prompt_text(served, prompt) if echo else None)

    async def generate_many(self, model: str, version: int, jobs: Jobs, deadline: float | None = None,
                            echo: bool = False, field: str = "prompt") -> list[GenerateResult]:
        """Every (prompt, params) of one request (KServe's prompts, OpenAI's prompts x n) on one version, admitted
        together or refused before any starts; one failing, or the caller going away, cancels the others.
        `field` names the request's prompts in a refusal of their number."""
        with self.lease(model, version, "generate_many") as served:
            return await _generated(served, jobs, deadline, echo, field)

    async def chat(self, model: str, version: int, messages: list[dict[str, Any]], params: list[GenerationParams],
                   deadline: float | None = None, field: str = "n", tools: list[dict[str, Any]] | None = None
                   ) -> list[GenerateResult]:
        """A chat request: `messages` rendered with the chat template of the version it leases
        (server/text/chat_template.py; INVALID_ARGUMENT naming `model` when its package has none), then
        generate_many of that prompt with each of `params` on that same version: one resolution, so a version
        swap cannot put one version's template before another's generation."""
        with self.lease(model, version, "generate_many") as served:
            return await _generated(served, _chat_jobs(served, messages, params, tools), deadline, False, field)

    async def generate_stream(self, model: str, version: int, prompt: str | list[int], params: GenerationParams,
                              deadline: float | None = None, echo: bool = False) -> RequestStream:
        """One sequence's stream (server/leases.py), admitted when this returns: its parts carry the version that
        produces them; closing it cancels the sequence. echo: the first part carries the prompt's text."""
        [stream] = await _streams(self.lease(model, version, "generate_stream"), lambda served: [(prompt, params)],
                                  deadline, echo, "prompt")
        return stream

    async def generate_streams(self, model: str, version: int, jobs: Jobs, deadline: float | None = None,
                               echo: bool = False, field: str = "prompt") -> list[RequestStream]:
        """generate_stream for every (prompt, params) of one request, admitted together (as generate_many): the
        request holds its version until the last stream is closed (or ends); close every one."""
        return await _streams(self.lease(model, version, "generate_streams"), lambda served: jobs, deadline, echo,
                              field)

    async def chat_streams(self, model: str, version: int, messages: list[dict[str, Any]],
                           params: list[GenerationParams], deadline: float | None = None,
                           field: str = "n", tools: list[dict[str, Any]] | None = None
                           ) -> list[RequestStream]:
        """chat, as generate_streams' streams: one lease from the template to the last stream's end."""
        return await _streams(self.lease(model, version, "generate_streams"),
                              lambda served: _chat_jobs(served, messages, params, tools), deadline, False, field)

    async def tokenize(self, model: str, version: int, text: str) -> Tokenized:
        """The tokens any model makes of a text (a generation model's: the prompt ids it would run), with strings,
        special marks and offsets (a long text tokenized off the event loop)."""
        served = self.repository.resolve(model, version).model
        tokens = await served.tokenize(text)
        return Tokenized(model=served.name, version=served.version, tokens=tokens,
                         max_length=served.max_length)

    async def detokenize(self, model: str, version: int, token_ids: list[int]) -> str:
        """The text of at most a context of token ids (INVALID_ARGUMENT naming `tokens` beyond it)."""
        return await self.repository.resolve(model, version).model.detokenize(token_ids)

    # ------------------------------------------------------------------ raw tensors

    async def infer(self, model: str, version: int, inputs: dict[str, np.ndarray], outputs: list[str] | None = None,
                    deadline: float | None = None) -> InferResult:
        """Graph tensors in, graph outputs out (encoders: through the model's dynamic batcher)."""
        with self.lease(model, version, "infer") as served:
            return await _inferred(served, inputs, outputs, deadline)

    async def model_infer(self, model: str, version: int, inputs: dict[str, np.ndarray], outputs: list[str] | None,
                          parameters: dict[str, Any], deadline: float | None = None) -> InferResult:
        """KServe ModelInfer on one lease: "text mode" (server/protocol/kserve.py) when the inputs are the texts of
        the leased version's task, its graph otherwise (as infer)."""
        admitted = self._admit(model, version)
        operation = infer_operation(admitted.task, inputs)
        with Lease(self._done, admitted, operation) as served:
            if operation == "infer":
                return await _inferred(served, inputs, outputs, deadline)
            request = text_request(served.task, inputs, parameters)
            answer = text_outputs(request.task, await _text_call(served, request, deadline))
            return InferResult(model=served.name, version=served.version, outputs=select_outputs(answer, outputs))

    # ------------------------------------------------------------------ models

    def _report(self, name: str, version: int, field: str) -> ModelVersion:
        """The version to report on (any state); NOT_FOUND naming `field` when there is none."""
        self.repository.model_dir(name, field)
        found = self.repository.find(name, version)
        if found is None:
            raise _unknown(field, name, version)
        return found

    def list_models(self) -> list[ModelStatus]:
        return self.repository.statuses()

    def model_info(self, model: str, version: int = 0) -> ModelInfo:
        if not version and model in self.repository.building:    # nothing loaded yet: its stage is its status
            return ModelInfo(status=self.repository.building_status(model), versions=[],
                             max_batch_size=self.settings.max_batch_size)
        found = self._report(model, version, "model")
        versions = self.repository.versions(model)
        if not found.loaded:
            return ModelInfo(status=found.status(), versions=versions, max_batch_size=self.settings.max_batch_size)
        served = found.model
        manifest = served.manifest
        per_slot, cache = served.cache_bytes
        return ModelInfo(status=found.status(), labels=list(manifest.labels), max_length=served.max_length,
                         mask_token=manifest.mask_token or "", variant=served.variant, providers=served.providers,
                         versions=versions, max_batch_size=served.max_batch_size,
                         manifest_json=served.package.manifest_text, cache_bytes_per_slot=per_slot, cache_bytes=cache)

    def model_ready(self, name: str, version: int = 0, field: str = "name") -> bool:
        self.repository.model_dir(name, field)
        found = self.repository.find(name, version)
        return bool(found and found.serving and not self.draining)

    def model_metadata(self, name: str, version: int = 0, field: str = "name") -> ModelMetadata:
        found = self._report(name, version, field)
        served = found.model  # UNAVAILABLE (with the state and reason) when it has no loaded graph
        return ModelMetadata(
            name=served.name, versions=self.repository.versions(served.name), platform=PLATFORM,
            inputs=[TensorMetadata(s.name, s.datatype, s.metadata_shape) for s in served.inputs],
            outputs=[TensorMetadata(s.name, s.datatype, s.metadata_shape) for s in served.outputs])

    def statistics(self, name: str = "", version: int = 0, field: str = "name") -> list[ModelStatistics]:
        """Counters of one model's versions (one version when given), or of every version not UNLOADED."""
        if name:
            self.repository.model_dir(name, field)
            versions = [m for m in self.repository.models() if m.name == name and (not version or m.version == version)]
            if not versions:
                raise _unknown(field, name, version)
        else:
            versions = [m for m in self.repository.models() if m.state is not ModelState.UNLOADED]
        return [m.stats.snapshot(m.name, m.version) for m in versions]

    def repository_index(self, ready_only: bool = False) -> list[RepositoryEntry]:
        """Every loaded version (any state) and name being built, then names on disk never loaded (unless
        ready_only)."""
        return self.repository.index(ready_only)

    async def load_model(self, name: str) -> ModelStatus:
        if self.draining:
            raise ServingError(Code.UNAVAILABLE, "server is shutting down")
        loaded = await self.repository.load(name)
        if not loaded.serving:
            raise ServingError(Code.FAILED_PRECONDITION, f"model {name!r} version {loaded.version} failed to load: "
                                                         f"{loaded.reason}")
        return loaded.status()

    async def unload_model(self, name: str) -> None:
        await self.repository.unload(name)


async def _inferred(served: ServedModel, inputs: dict[str, np.ndarray], outputs: list[str] | None,
                    deadline: float | None) -> InferResult:
    result = await served.infer(inputs, outputs, deadline)
    return InferResult(model=served.name, version=served.version, outputs=select_outputs(result, outputs))


async def _generated(served: ServedModel, jobs: Jobs, deadline: float | None, echo: bool,
                     field: str) -> list[GenerateResult]:
    check_echo(served, echo)
    outputs = await served.generate_many(jobs, deadline, field)
    return [GenerateResult(model=served.name, version=served.version, output=output,
                           prompt_text=prompt_text(served, prompt) if echo else None)
            for output, (prompt, _) in zip(outputs, jobs)]


async def _text_call(served: ServedModel, request: TextRequest, deadline: float | None) -> Any:
    """The task call of a KServe text-mode ModelInfer (server/protocol/kserve.py) on the model it leased."""
    task, texts, truncate = request.task, request.texts, request.truncate
    if task == "generate":
        # One request: its prompts admitted together, and cancelled together when one fails or the caller leaves.
        return await served.generate_many([(p, request.params) for p in texts], deadline, "inputs['prompt']")
    if task == "classify":
        return await served.classify(request.classify_inputs, 0, truncate, deadline, request.function_to_apply)
    if task == "embed":
        return await served.embed(texts, truncate, deadline)
    if task == "token-classify":
        return await served.token_classify(texts, request.aggregation_strategy, request.ignore_labels, truncate,
                                           deadline)
    return await served.fill_mask(texts, 1, truncate, deadline)


def _chat_jobs(served: ServedModel, messages: list[dict[str, Any]], params: list[GenerationParams],
               tools: list[dict[str, Any]] | None = None) -> Jobs:
    """A chat request's jobs: its prompt (and tools), rendered with the served version's template, with each of
    params."""
    prompt = chat_prompt(served.chat_template(), served.name, messages, tools)
    return [(prompt, p) for p in params]


async def _streams(lease: Lease, jobs_of: Callable[[ServedModel], Jobs], deadline: float | None, echo: bool,
                   field: str) -> list[RequestStream]:
    """The streams of one request's jobs (jobs_of the leased model), admitted together, holding `lease` until the
    last one ends or is closed."""
    served = lease.__enter__()
    try:
        check_echo(served, echo)
        jobs = jobs_of(served)
        streams = await served.stream_many(jobs, deadline, field)
    except BaseException as exc:
        lease.__exit__(type(exc), exc, None)
        raise
    held = SharedLease(lease, len(streams))
    return [RequestStream(served, stream, prompt if echo else None, held, lease.span)
            for stream, (prompt, _) in zip(streams, jobs)]


__all__ = ["DataPlane", "PLATFORM"]
