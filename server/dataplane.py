"""The data plane: every model operation, shared by the task and KServe servicers and usable in-process.

No gRPC here: errors are ServingError(code, message); the servicers map them to status codes.

    plane = await DataPlane.start(settings)
    result = await plane.classify("genre", 0, [("To be or not to be", None)])
    await plane.close()
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any, AsyncIterator

import numpy as np
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument as OrtInvalidArgument

from server import tasks
from server.batching import BatchConfig
from server.errors import Code, ServingError
from server.generation import (EngineStoppedError, GenerationConfig, GenerationParams, GenerationResult,
                               OverloadedError, StreamChunk)
from server.metrics import Metrics
from server.model import RuntimeConfig, ServedModel
from server.repository import ModelRepository
from server.sessions import SessionConfig, resolve_providers
from server.settings import ServerSettings
from server.signature import check_inputs
from server.types import ClassifyResult, FillMaskResult, ModelInfo, ModelStatus

log = logging.getLogger(__name__)

# KServe ModelInfer "text mode": BYTES inputs with these names run the task pipeline instead of the graph.
TEXT_INPUTS = {"classify": {"text", "text_pair"}, "fill-mask": {"text"}, "generate": {"prompt"}}


def runtime_config(settings: ServerSettings) -> RuntimeConfig:
    return RuntimeConfig(
        session=SessionConfig(providers=resolve_providers(settings.providers),
                              intra_op_threads=settings.intra_op_threads,
                              inter_op_threads=settings.inter_op_threads, variant=settings.variant),
        batch=BatchConfig(max_batch_size=settings.max_batch_size,
                          max_queue_delay_s=settings.max_queue_delay_ms / 1000.0,
                          max_queued_requests=settings.max_queued_requests),
        generation=GenerationConfig(max_batch_size=settings.max_sequences,
                                    max_waiting=settings.max_queued_requests,
                                    max_tokens_in_flight=settings.max_tokens_in_flight))


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

    @property
    def ready(self) -> bool:
        return self.loaded and not self.draining

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

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        await self.repository.close()

    # ------------------------------------------------------------------ admission

    def _admit(self, name: str, version: int) -> ServedModel:
        """Resolves and counts a request in, without awaiting (so a swap cannot slip in between)."""
        if self.draining:
            raise ServingError(Code.UNAVAILABLE, "server is shutting down")
        if not name:
            raise ServingError.invalid("model", "must name a model")
        model = self.repository.resolve(name, version)
        model.acquire()
        self._inflight += 1
        self._idle.clear()
        return model

    def _done(self, model: ServedModel) -> None:
        model.release()
        self._inflight -= 1
        if self._inflight == 0:
            self._idle.set()

    @contextlib.asynccontextmanager
    async def lease(self, name: str, version: int = 0) -> AsyncIterator[ServedModel]:
        model = self._admit(name, version)
        started = time.perf_counter()
        ok = False
        try:
            yield model
            ok = True
        finally:
            model.stats.record_request(ok, time.perf_counter() - started)
            self._done(model)

    # ------------------------------------------------------------------ tasks

    async def classify(self, model: str, version: int, inputs: list[tuple[str, str | None]], top_k: int = 0,
                       truncate: bool = False, deadline: float | None = None) -> ClassifyResult:
        async with self.lease(model, version) as served:
            results = await tasks.classify(served, inputs, top_k, truncate, deadline)
            return ClassifyResult(model=served.name, version=served.version, results=results)

    async def fill_mask(self, model: str, version: int, texts: list[str], top_k: int = 5, truncate: bool = False,
                        deadline: float | None = None) -> FillMaskResult:
        async with self.lease(model, version) as served:
            if not texts:
                raise ServingError.invalid("texts", "at least one text is required")
            results = await tasks.fill_mask(served, texts, top_k, truncate, deadline)
            return FillMaskResult(model=served.name, version=served.version, results=results)

    async def generate(self, model: str, version: int, prompt: str, params: GenerationParams,
                       deadline: float | None = None) -> GenerationResult:
        return (await self.generate_versioned(model, version, prompt, params, deadline))[1]

    async def generate_versioned(self, model: str, version: int, prompt: str, params: GenerationParams,
                                 deadline: float | None = None) -> tuple[int, GenerationResult]:
        """Like generate, with the version that served it."""
        async with self.lease(model, version) as served:
            engine = _engine(served)
            with _engine_errors():
                return served.version, await engine.generate(prompt, params, deadline)

    async def generate_stream(self, model: str, version: int, prompt: str, params: GenerationParams,
                              deadline: float | None = None) -> AsyncIterator[StreamChunk]:
        async for _, chunk in self.generate_stream_versioned(model, version, prompt, params, deadline):
            yield chunk

    async def generate_stream_versioned(self, model: str, version: int, prompt: str, params: GenerationParams,
                                        deadline: float | None = None) -> AsyncIterator[tuple[int, StreamChunk]]:
        """(version, chunk) pairs; closing the iterator cancels the sequence and frees its slot."""
        async with self.lease(model, version) as served:
            engine = _engine(served)
            stream = engine.stream(prompt, params, deadline)
            try:
                with _engine_errors():
                    async for chunk in stream:
                        yield served.version, chunk
            finally:
                await stream.aclose()

    # ------------------------------------------------------------------ raw tensors (KServe ModelInfer)

    async def infer(self, model: str, version: int, inputs: dict[str, np.ndarray], outputs: list[str] | None = None,
                    parameters: dict[str, Any] | None = None, deadline: float | None = None) -> dict[str, np.ndarray]:
        return (await self.infer_versioned(model, version, inputs, outputs, parameters, deadline))[1]

    async def infer_versioned(self, model: str, version: int, inputs: dict[str, np.ndarray],
                              outputs: list[str] | None = None, parameters: dict[str, Any] | None = None,
                              deadline: float | None = None) -> tuple[int, dict[str, np.ndarray]]:
        async with self.lease(model, version) as served:
            if not inputs:
                raise ServingError.invalid("inputs", "at least one input is required")
            text_names = TEXT_INPUTS.get(served.task, set())
            if set(inputs) <= text_names and all(a.dtype == object for a in inputs.values()):
                result = await self._infer_text(served, inputs, parameters or {}, deadline)
            else:
                result = await self._infer_raw(served, inputs, outputs, deadline)
            if outputs:
                for i, name in enumerate(outputs):
                    if name not in result:
                        raise ServingError.invalid(f"outputs[{i}].name",
                                                   f"{name!r} is not an output (outputs: {sorted(result)})")
                result = {name: result[name] for name in outputs}
            return served.version, result

    async def _infer_raw(self, served: ServedModel, inputs: dict[str, np.ndarray], outputs: list[str] | None,
                         deadline: float | None) -> dict[str, np.ndarray]:
        assert served.loaded is not None
        check_inputs(served.loaded.inputs, inputs)
        max_length = served.manifest.get("max_length")
        for spec in served.loaded.inputs:
            for axis, dim in enumerate(spec.dims):
                size = inputs[spec.name].shape[axis]
                if dim == ("sequence",) and isinstance(max_length, int) and size > max_length:
                    # An encoder fails inside its position embeddings with a broadcast error (INTERNAL).
                    raise ServingError.invalid(f"inputs[{spec.name!r}].shape", f"axis {axis} (sequence) is {size}, "
                                                                             f"the model's max_length is {max_length}")
        vocab = served.manifest.get("vocab_size")
        ids = inputs.get("input_ids")
        if isinstance(vocab, int) and ids is not None and ids.size and (ids.min() < 0 or ids.max() >= vocab):
            # onnxruntime would fail inside its Gather kernel with a message naming a graph node.
            bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
            raise ServingError.invalid("inputs['input_ids']", f"token id {bad} is outside the vocabulary [0, {vocab})")
        graph_outputs = served.loaded.runner.output_names
        wanted = [n for n in (outputs or graph_outputs) if n in graph_outputs] or graph_outputs
        if deadline is not None and time.monotonic() >= deadline:
            raise ServingError(Code.DEADLINE_EXCEEDED, "deadline passed before compute")
        rows = next(iter(inputs.values())).shape[0] if next(iter(inputs.values())).ndim else 1
        start = time.perf_counter()
        try:
            result = await asyncio.get_running_loop().run_in_executor(None, served.loaded.runner.run, inputs, wanted)
        except OrtInvalidArgument as exc:
            raise ServingError.invalid("inputs", f"onnxruntime rejected them: {exc}") from None
        except Exception as exc:
            raise ServingError(Code.INTERNAL, f"inference failed: {exc}") from None
        served.stats.record_execution(rows, time.perf_counter() - start)
        self.metrics.batch_size.labels(served.name).observe(rows)
        return result

    async def _infer_text(self, served: ServedModel, inputs: dict[str, np.ndarray], parameters: dict[str, Any],
                          deadline: float | None) -> dict[str, np.ndarray]:
        def texts(name: str) -> list[str]:
            array = inputs[name]
            try:
                return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]
            except UnicodeDecodeError:
                raise ServingError.invalid(f"inputs[{name!r}]", "BYTES elements must be UTF-8 text") from None

        truncate = bool(parameters.get("truncate", False))
        if served.task == "generate":
            params = _params_from(parameters)
            engine = _engine(served)
            with _engine_errors():
                results = await asyncio.gather(*(engine.generate(p, params, deadline) for p in texts("prompt")))
            return {"text": _bytes_array([r.text for r in results]),
                    "finish_reason": _bytes_array([r.finish_reason for r in results])}
        if "text" not in inputs:
            raise ServingError.invalid("inputs", "missing input 'text'")
        main = texts("text")
        if served.task == "classify":
            pairs = texts("text_pair") if "text_pair" in inputs else [None] * len(main)
            if len(pairs) != len(main):
                raise ServingError.invalid("inputs['text_pair'].shape", "must have as many elements as 'text'")
            results = await tasks.classify(served, list(zip(main, pairs)), 0, truncate, deadline)
            labels: list[str] = served.manifest["labels"]
            probs = np.array([[next(s.score for s in r.scores if s.label == label) for label in labels]
                              for r in results], dtype=np.float32)
            return {"label": _bytes_array([r.label for r in results]),
                    "score": np.array([r.score for r in results], dtype=np.float32), "probabilities": probs}
        filled = await tasks.fill_mask(served, main, 1, truncate, deadline)
        return {"sequence": _bytes_array([_fill_all(served, text_masks) for text_masks in filled])}

    # ------------------------------------------------------------------ models

    def list_models(self) -> list[ModelStatus]:
        return self.repository.statuses()

    def model_info(self, model: str, version: int = 0) -> ModelInfo:
        self.repository.model_dir(model, "model")
        served = self.repository.find(model, version)
        if served is None:
            what = f"version {version} of " if version else ""
            raise ServingError(Code.NOT_FOUND, f"model: unknown {what}model {model!r}")
        info = ModelInfo(status=served.status(), versions=self.repository.versions(model),
                         max_batch_size=self.settings.max_batch_size)
        if served.loaded is None:
            return info
        manifest = served.manifest
        return ModelInfo(status=served.status(), labels=list(manifest.get("labels") or []),
                         max_length=manifest["max_length"], mask_token=manifest.get("mask_token") or "",
                         variant=served.loaded.variant, providers=list(served.loaded.runner.providers),
                         versions=self.repository.versions(model),
                         max_batch_size=(self.settings.max_sequences if served.task == "generate"
                                         else self.settings.max_batch_size),
                         manifest_json=served.loaded.package.manifest_text)

    async def load_model(self, name: str) -> ModelStatus:
        if self.draining:
            raise ServingError(Code.UNAVAILABLE, "server is shutting down")
        model = await self.repository.load(name)
        if not model.serving:
            raise ServingError(Code.FAILED_PRECONDITION, f"model {name!r} version {model.version} failed to load: "
                                                         f"{model.reason}")
        return model.status()

    async def unload_model(self, name: str) -> None:
        await self.repository.unload(name)


def _engine(served: ServedModel) -> Any:
    if served.task != "generate":
        raise ServingError.invalid("model", f"{served.name!r} is a {served.task} model, not generate")
    assert served.loaded is not None and served.loaded.engine is not None
    return served.loaded.engine


@contextlib.contextmanager
def _engine_errors() -> Any:
    """The generation engine's exceptions -> ServingError."""
    try:
        yield
    except ValueError as exc:
        raise ServingError(Code.INVALID_ARGUMENT, str(exc)) from None
    except OverloadedError as exc:
        raise ServingError(Code.RESOURCE_EXHAUSTED, str(exc)) from None
    except TimeoutError as exc:
        raise ServingError(Code.DEADLINE_EXCEEDED, str(exc) or "deadline exceeded") from None
    except EngineStoppedError as exc:
        raise ServingError(Code.UNAVAILABLE, str(exc)) from None
    except RuntimeError as exc:
        raise ServingError(Code.INTERNAL, str(exc)) from None


_PARAM_KEYS = ("max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "seed", "truncate_prompt",
               "ignore_eos")


def _params_from(parameters: dict[str, Any]) -> GenerationParams:
    """KServe request parameters -> GenerationParams (stop sequences as a JSON list in "stop")."""
    fields = {k: parameters[k] for k in _PARAM_KEYS if k in parameters}
    for key in ("temperature", "top_p", "repetition_penalty"):
        if isinstance(fields.get(key), int) and not isinstance(fields.get(key), bool):
            fields[key] = float(fields[key])
    if "stop" in parameters:
        try:
            fields["stop"] = json.loads(parameters["stop"])
        except (TypeError, json.JSONDecodeError):
            raise ServingError.invalid("parameters.stop", "must be a JSON list of strings") from None
        if not isinstance(fields["stop"], list):  # '5' or 'Infinity' parse as JSON too (TypeError -> INTERNAL)
            raise ServingError.invalid("parameters.stop", "must be a JSON list of strings")
    try:
        return GenerationParams.validate(**fields)
    except ValueError as exc:
        raise ServingError(Code.INVALID_ARGUMENT, str(exc)) from None


def _bytes_array(values: list[str]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = [v.encode("utf-8") for v in values]
    return out


def _fill_all(served: ServedModel, masks: list[Any]) -> str:
    """The text with every mask replaced by its best candidate."""
    if len(masks) == 1:
        return masks[0].candidates[0].sequence
    assert served.loaded is not None and served.loaded.encoder is not None
    # Each candidate's sequence fills only its own mask: fill the others, left to right, by hand.
    tokenizer = served.loaded.encoder.tokenizer
    mask_token = served.manifest["mask_token"]
    text = masks[0].candidates[0].sequence
    for m in masks[1:]:
        text = text.replace(mask_token, tokenizer.decode([m.candidates[0].token_id]), 1)
    return text
