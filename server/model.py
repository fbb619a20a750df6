"""A loaded model version: the typed served models' common part and how one is built from its package.

    ServedModel            package, session runner, graph signature, raw-input checks, warm-up / start / close
    ├── EncoderModel       (server/encoders/encoder.py)  batcher; classify, fill-mask, raw infer through the batcher
    └── DecoderModel       (server/generation/decoder_model.py)  generation engine; generate, stream_many, raw infer

Every task method exists on every model: a model of another task answers INVALID_ARGUMENT naming `model`.
Building one from its package: server/repository/loading.py.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import AsyncIterator

import numpy as np

from modelpkg import Manifest
from server.admission import AdmissionLimits, check_response_bytes, check_rows, tensor_bytes
from server.encoders.batching import BatchConfig
from server.protocol.codecs import kserve_datatype
from server.protocol.errors import Code, ServingError
from server.generation import GenerationConfig, GenerationParams, GenerationResult, StreamChunk
from server.runtime.metrics import Metrics
from server.repository.package import Package
from server.protocol.pairs import PairScores, Pairs
from server.sessions import SessionConfig, SessionRunner
from server.repository.signature import TensorSpec, check_inputs, specs_from_manifest
from server.runtime.stats import ModelStats
from server.text.spans import TokenSpan
from server.protocol.types import ChatTemplate, ClassifyResult, EmbedResult, FillMaskResult, TokenClassifyResult
from server.protocol.zero_shot import ZeroShotRequest, ZeroShotResult

Feeds = dict[str, np.ndarray]


@dataclass(frozen=True)
class RuntimeConfig:
    """Everything a model version needs from the settings."""

    session: SessionConfig
    batch: BatchConfig
    generation: GenerationConfig
    admission: AdmissionLimits = AdmissionLimits()
    generation_instances: int = 1     # engines per decoder (server/generation/decoder_model.py)


@dataclass(frozen=True)
class Loaded:
    """What every served model is made of (built in the worker thread)."""

    package: Package
    variant: str
    runner: SessionRunner
    runtime: RuntimeConfig
    metrics: Metrics
    stats: ModelStats
    notes: tuple[str, ...] = ()     # why better variants were passed over here (the version's reason shows them)

    @property
    def manifest(self) -> Manifest:
        return self.package.manifest


class ServedModel(ABC):
    def __init__(self, parts: Loaded) -> None:
        self.package = parts.package
        self.manifest = parts.package.manifest
        self.name = parts.package.name
        self.version = parts.package.version
        self.task = parts.package.task
        self.variant = parts.variant
        self.notes = parts.notes
        self.runner = parts.runner
        self.runtime = parts.runtime
        self.metrics = parts.metrics
        self.stats = parts.stats
        # model.json lists the fp32 graph's tensors; a variant's graph may differ in element type (kv8 keeps its
        # cache in int8), so raw callers are checked against the graph actually served.
        session = self.runner.session
        self.inputs: list[TensorSpec] = _typed_as(specs_from_manifest(self.manifest.inputs), session.get_inputs())
        self.outputs: list[TensorSpec] = _typed_as(specs_from_manifest(self.manifest.outputs), session.get_outputs())

    @property
    def providers(self) -> list[str]:
        return list(self.runner.providers)

    @property
    @abstractmethod
    def max_batch_size(self) -> int:
        """Rows (encoder) or sequences (decoder) computed together."""

    @property
    def max_length(self) -> int:
        """The served context: the package's max_length (a generation model's may be capped at load)."""
        return self.manifest.max_length

    @property
    def cache_bytes(self) -> tuple[int, int]:
        """(KV-cache bytes per slot, in all): none for a model without a generation cache."""
        return 0, 0

    # ------------------------------------------------------------------ lifecycle

    @abstractmethod
    def warm_up(self) -> None:
        """Runs the graph on a few shapes (worker thread); PackageError when it fails."""

    @abstractmethod
    async def start(self) -> None:
        """Starts the background part (batcher / engine) on the event loop."""

    @abstractmethod
    async def close(self) -> None:
        """Stops the background part; queued requests end with UNAVAILABLE / cancelled."""

    # ------------------------------------------------------------------ requests

    @abstractmethod
    async def infer(self, inputs: Feeds, outputs: list[str] | None, deadline: float | None) -> Feeds:
        """Raw graph tensors in, every (or the requested) graph output out."""

    async def classify(self, inputs: list[tuple[str, str | None]], top_k: int, truncate: bool,
                       deadline: float | None, function_to_apply: str | None = None) -> ClassifyResult:
        raise self._not("classify")

    async def zero_shot_classify(self, request: ZeroShotRequest, deadline: float | None) -> ZeroShotResult:
        """Candidate labels scored by an NLI classifier (server/encoders/zero_shot.py)."""
        raise self._not("classify")

    async def fill_mask(self, texts: list[str], top_k: int, truncate: bool,
                        deadline: float | None) -> FillMaskResult:
        raise self._not("fill-mask")

    async def embed(self, texts: list[str], truncate: bool, deadline: float | None,
                    dimensions: int | None = None, prompt_name: str | None = None) -> EmbedResult:
        raise self._not("embed")

    async def score(self, pairs: Pairs, truncate: bool, deadline: float | None) -> PairScores:
        """Each text pair's relevance (server/encoders/rerank.py): a cross-encoder's or an embedding model's."""
        raise self._not("rerank or score")

    async def token_classify(self, texts: list[str], aggregation_strategy: str, ignore_labels: list[str] | None,
                             truncate: bool, deadline: float | None) -> TokenClassifyResult:
        raise self._not("token-classify")

    async def generate(self, prompt: str | list[int], params: GenerationParams,
                       deadline: float | None) -> GenerationResult:
        raise self._not("generate")

    async def generate_many(self, jobs: list[tuple[str | list[int], GenerationParams]], deadline: float | None,
                            field: str) -> list[GenerationResult]:
        """Every (prompt, params) of one request, admitted together or not at all; `field` names the request's
        prompts in a refusal of their number."""
        raise self._not("generate")

    async def stream_many(self, jobs: list[tuple[str | list[int], GenerationParams]], deadline: float | None,
                          field: str) -> list[AsyncIterator[StreamChunk]]:
        """generate_many, as one chunk stream per job (closing one cancels its sequence): the engine's own, read by
        the request's one stream (server/leases.py), which maps their errors."""
        raise self._not("generate")

    @abstractmethod
    async def tokenize(self, text: str) -> list[TokenSpan]:
        """The tokens a text becomes (a decoder's: what generation would run), with strings, special marks and
        character offsets; INVALID_ARGUMENT naming `prompt` for a text longer than any context can take."""

    @abstractmethod
    async def detokenize(self, token_ids: list[int]) -> str:
        """The text of at most a context of token ids (INVALID_ARGUMENT naming `tokens`, or the first id outside
        the vocabulary)."""

    def prompt_text(self, token_ids: list[int]) -> str:
        """The text of an admitted token-id prompt (its ids were checked when it was admitted)."""
        raise self._not("generate")

    def chat_template(self) -> ChatTemplate | None:
        """The package's chat template (model.json `chat_template`), None when it carries none."""
        template = self.manifest.extra.get("chat_template")
        return ChatTemplate(template) if isinstance(template, str) and template else None

    def _not(self, task: str) -> ServingError:
        return ServingError.invalid("model", f"{self.name!r} is a {self.task} model, not {task}")

    def check_raw_inputs(self, inputs: Feeds) -> None:
        """INVALID_ARGUMENT naming the input for what the graph would otherwise fail on deep inside."""
        if not inputs:
            raise ServingError.invalid("inputs", "at least one input is required")
        check_inputs(self.inputs, inputs)
        max_length = self.manifest.max_length
        for spec in self.inputs:
            for axis, dim in enumerate(spec.dims):
                size = inputs[spec.name].shape[axis]
                if dim == ("sequence",) and size > max_length:
                    # An encoder fails inside its position embeddings with a broadcast error (INTERNAL).
                    raise ServingError.invalid(f"inputs[{spec.name!r}].shape", f"axis {axis} (sequence) is {size}, "
                                                                             f"the model's max_length is {max_length}")
        vocab = self.manifest.vocab_size
        ids = inputs.get("input_ids")
        if vocab is not None and ids is not None and ids.size and (ids.min() < 0 or ids.max() >= vocab):
            # onnxruntime would fail inside its Gather kernel with a message naming a graph node.
            bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
            raise ServingError.invalid("inputs['input_ids']", f"token id {bad} is outside the vocabulary [0, {vocab})")

    def check_raw_cost(self, inputs: Feeds, wanted: list[str]) -> None:
        """Admission of a raw call (server/admission.py): rows per request, and the outputs' size, estimated from
        the manifest's symbolic axes sized by the caller's tensors, against the largest message."""
        limits = self.runtime.admission
        first = next(iter(inputs.values()))
        check_rows("inputs", int(first.shape[0]) if first.ndim else 1, limits)
        sizes = {"vocab": self.manifest.vocab_size or 1, "labels": len(self.manifest.labels) or 1}
        for spec in self.inputs:
            array = inputs.get(spec.name)
            for dim, size in zip(spec.dims, array.shape if array is not None else ()):
                if isinstance(dim, tuple) and len(dim) == 1:
                    sizes.setdefault(dim[0], int(size))
        widest = max([size for symbol, size in sizes.items() if symbol not in ("vocab", "labels")] or [1])
        estimate = tensor_bytes([s for s in self.outputs if s.name in wanted], sizes, widest)
        check_response_bytes(estimate, limits, "outputs")

    def wanted_outputs(self, outputs: list[str] | None) -> list[str]:
        """The graph outputs to compute: the requested ones the graph has, else all (unknown names are refused
        after the run, by the data plane, with the full output list)."""
        graph = self.runner.output_names
        return [n for n in (outputs or graph) if n in graph] or graph

    @staticmethod
    def check_deadline(deadline: float | None) -> None:
        if deadline is not None and time.monotonic() >= deadline:
            raise ServingError(Code.DEADLINE_EXCEEDED, "deadline passed before compute")


def _typed_as(specs: list[TensorSpec], graph_args) -> list[TensorSpec]:
    """The specs with each element type taken from the graph's argument of the same name."""
    types = {a.name: a.type for a in graph_args}
    out = []
    for spec in specs:
        try:
            out.append(replace(spec, datatype=kserve_datatype(types[spec.name])) if spec.name in types else spec)
        except ValueError:    # a type KServe has no name for: keep the manifest's
            out.append(spec)
    return out
