"""Batch runner that runs the model package in-process, through the server's data plane (no gRPC).

Answers are converted to the client's dataclasses exactly as they would arrive over the wire
(scores rounded to float32, as protobuf `float` does), so --local output equals server output.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from ..errors import OrtserveError
from ..types import (
    Classification,
    FillMaskResult,
    GeneratedToken,
    Generation,
    LabelScore,
    MaskPrediction,
    TokenCandidate,
    TokenLogprob,
    Usage,
)
from .groups import AdmissionGroups
from .input import Record
from .tasks import (TaskConfig, classification_payload, embedding_payload, fill_mask_payload,
                     generation_payload)

log = logging.getLogger(__name__)


def _f32(value: float) -> float:
    return float(np.float32(value))


def _classification(c: Any) -> Classification:
    return Classification(label=c.label, score=_f32(c.score),
                          scores=[LabelScore(label=s.label, score=_f32(s.score)) for s in c.scores])


def _fill_mask(masks: Any) -> FillMaskResult:
    return FillMaskResult(masks=[
        MaskPrediction(position=int(m.position), candidates=[
            TokenCandidate(token=c.token, token_id=int(c.token_id), score=_f32(c.score), sequence=c.sequence)
            for c in m.candidates])
        for m in masks])


def _tokens(tokens: Any, with_logprobs: bool) -> list[GeneratedToken]:
    """As the server's tokens reach a client over gRPC (float32 logprobs)."""
    return [GeneratedToken(
        token_id=int(t.token_id),
        logprob=_f32(t.logprob) if with_logprobs and t.logprob is not None else None,
        top_logprobs=[TokenLogprob(token_id=int(a.token_id), token=a.token, logprob=_f32(a.logprob))
                      for a in t.top_logprobs])
        for t in tokens]


def _generation(r: Any, with_logprobs: bool) -> Generation:
    return Generation(text=r.text, finish_reason=r.finish_reason or "",
                      usage=Usage(int(r.usage.prompt_tokens), int(r.usage.completion_tokens),
                                  int(r.usage.cached_prompt_tokens)), tokens=_tokens(r.tokens, with_logprobs),
                      time_to_first_token_ms=float(r.time_to_first_token_ms), total_time_ms=float(r.total_time_ms),
                      prompt_tokens=_tokens(r.prompt_tokens, True))


def _as_ortserve_error(error: Exception) -> OrtserveError:
    """The data plane's errors carry the names of gRPC codes; a ValueError is a bad field."""
    code_name = getattr(getattr(error, "code", None), "value", None) or "INVALID_ARGUMENT"
    code = getattr(grpc.StatusCode, str(code_name), grpc.StatusCode.UNKNOWN)
    return OrtserveError(code, getattr(error, "message", None) or str(error))


class LocalRunner:
    def __init__(self, plane: Any, config: TaskConfig) -> None:
        self.plane = plane
        self.config = config
        self._params: Any = None     # the server's GenerationParams of the task's, checked once for every record
        self._groups: AdmissionGroups | None = None    # generation records admitted a turn's worth at a time

    def _generation_params(self) -> Any:
        """The task's generation parameters as the server takes them (ValueError naming the field when invalid)."""
        if self._params is None:
            from server.generation.params import GenerationParams as ServerParams

            g = self.config.generation
            self._params = ServerParams.validate(
                max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_k=g.top_k, top_p=g.top_p,
                repetition_penalty=g.repetition_penalty, stop=list(g.stop), stop_token_ids=list(g.stop_token_ids),
                seed=g.seed, logprobs=g.logprobs, top_logprobs=g.top_logprobs, truncate_prompt=g.truncate_prompt,
                ignore_eos=g.ignore_eos, presence_penalty=g.presence_penalty,
                frequency_penalty=g.frequency_penalty, logit_bias=dict(g.logit_bias), min_p=g.min_p,
                min_tokens=g.min_tokens, prompt_logprobs=g.prompt_logprobs, num_beams=g.num_beams,
                length_penalty=g.length_penalty, early_stopping=g.early_stopping)
        return self._params

    @classmethod
    async def start(cls, repository: Path, config: TaskConfig, intra_op_threads: int = 0, instances: int = 1,
                    max_sequences: int | None = None, variant: str | None = None,
                    max_queued_requests: int | None = None, processes: int = 1) -> "LocalRunner":
        """The server's data plane in-process. instances > 1: that many generation engines per model (each with
        cores / instances onnxruntime threads unless intra_op_threads says otherwise: server/dataplane.py).
        variant: the package variant to load (None: the server's choice, the package's default for the device);
        max_queued_requests: the server's setting (None: its default); processes: how many processes of this shape
        share the cores (a ProcessRunner's children): the server's rule for decode steps overlapping the event loop
        counts all their onnxruntime threads. The process takes the server's collector thresholds
        (server.runtime.eventloop.tune_collector): it runs engines as the server's does."""
        # Imported here: the client library itself never needs the server package.
        from server.dataplane import DataPlane
        from server.runtime.eventloop import tune_collector
        from server.runtime.settings import ServerSettings, SettingsError
        from server.runtime_config import leaves_a_core

        given = {"max_sequences": max_sequences, "variant": variant, "max_queued_requests": max_queued_requests}
        extra = {name: value for name, value in given.items() if value is not None}   # else the server's defaults
        if processes > 1 and not leaves_a_core(processes * instances * max(intra_op_threads, 1)):
            extra["overlap_step_ms"] = 0.0       # each child sees every core, but its siblings' threads take theirs
        try:
            settings = ServerSettings(repository=Path(repository), port=0, metrics_port=-1, poll_interval=0,
                                      intra_op_threads=intra_op_threads, generation_instances=instances,
                                      **extra).validate()
        except SettingsError as e:
            raise ValueError(f"local: {e}") from None
        tune_collector()     # this process now runs engines, as the server's does
        plane = await DataPlane.start(settings)
        return cls(plane, config)

    async def run(self, record: Record) -> dict[str, Any]:
        from server.protocol.errors import ServingError

        c = self.config
        version = c.version or 0
        try:
            if c.task == "classify":
                result = await self.plane.classify(c.model, version, [(record.text, record.text_pair)],
                                                   top_k=c.effective_top_k, truncate=c.truncate)
                return classification_payload(_classification(result.results[0]))
            if c.task == "fill-mask":
                result = await self.plane.fill_mask(c.model, version, [record.text], top_k=c.effective_top_k,
                                                    truncate=c.truncate)
                return fill_mask_payload(_fill_mask(result.results[0]))
            if c.task == "embed":
                embedded = await self.plane.embed(c.model, version, [record.text], truncate=c.truncate)
                return embedding_payload(embedded.embeddings[0].tolist(), embedded.token_counts[0])
            g = c.generation
            params = self._generation_params()
            if self._groups is None:
                self._groups = AdmissionGroups(self.plane, c.model, version)
            result = await self._groups.generate(record.text, params)
            return generation_payload(_generation(result.output, g.wants_logprobs), g.wants_logprobs)
        except (ServingError, ValueError) as e:
            raise _as_ortserve_error(e) from None

    async def close(self) -> None:
        if self._groups is not None:
            self._groups.close()
        await self.plane.close()
