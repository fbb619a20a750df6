"""Typed results and parameters of the task API (plain dataclasses, independent of protobuf)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# The results the server holds the same, field for field (protos/results.py); the client's own are below.
from protos.results import (Classification, LabelScore, MaskPrediction, TokenCandidate, TokenEntity, TokenLogprob,
                            TokenSpan, Usage, ZeroShotClassification)

__all__ = ["Classification", "Embedding", "FillMaskResult", "GeneratedToken", "Generation", "GenerationParams",
           "LabelScore", "MaskPrediction", "ModelInfo", "ModelStatus", "RankedDocument", "StreamChunk",
           "TokenCandidate", "TokenEntity", "TokenLogprob", "Tokenization", "TokenSpan", "Usage", "ZeroShotClassification",
           "to_jsonable"]


@dataclass(frozen=True)
class FillMaskResult:
    masks: list[MaskPrediction] = field(default_factory=list)


@dataclass(frozen=True)
class Embedding:
    values: list[float]      # the vector (unit L2 norm when `normalized`)
    tokens: int = 0          # tokens of the text as the model saw them
    normalized: bool = False


@dataclass(frozen=True)
class GeneratedToken:
    token_id: int
    logprob: float | None = None  # only when logprobs were asked for
    top_logprobs: list[TokenLogprob] = field(default_factory=list)


@dataclass(frozen=True)
class Generation:
    text: str
    finish_reason: str  # "length" | "eos" | "stop" | "cancelled" | ""
    usage: Usage
    tokens: list[GeneratedToken] = field(default_factory=list)
    model: str = ""
    version: int = 0
    time_to_first_token_ms: float = 0.0
    total_time_ms: float = 0.0
    # With prompt_logprobs: one per prompt token; the first has no context, so its logprob is None.
    prompt_tokens: list[GeneratedToken] = field(default_factory=list)


@dataclass(frozen=True)
class StreamChunk:
    text: str  # text produced since the previous chunk
    tokens: list[GeneratedToken] = field(default_factory=list)
    final: bool = False
    finish_reason: str | None = None  # set on the final chunk only
    usage: Usage | None = None        # set on the final chunk only
    model: str = ""
    version: int = 0
    prompt_tokens: list[GeneratedToken] = field(default_factory=list)   # with prompt_logprobs, on the first token's


@dataclass(frozen=True)
class Tokenization:
    tokens: list[TokenSpan]
    max_length: int  # the model's context

    @property
    def ids(self) -> list[int]:
        return [t.id for t in self.tokens]


@dataclass(frozen=True)
class RankedDocument:
    index: int       # the document's position in the request
    score: float
    document: str = ""   # with return_documents


@dataclass(frozen=True)
class ModelStatus:
    name: str
    version: int
    task: str   # "classify" | "fill-mask" | "generate"
    state: str  # "LOADING" | "SERVING" | "NOT_SERVING" | "UNLOADED" | "BUILDING" (version 0, its stage as reason)
    reason: str = ""
    variant: str = ""  # the ONNX variant a loaded version runs (fp32, kv8, w8, w4, ...); "" when none is loaded


@dataclass(frozen=True)
class ModelInfo:
    status: ModelStatus
    labels: list[str]
    max_length: int
    mask_token: str
    variant: str
    providers: list[str]
    versions: list[int]
    max_batch_size: int
    manifest: dict[str, Any]  # the package's model.json
    cache_bytes_per_slot: int = 0   # a generation model's KV cache: one slot's bytes, every slot's together
    cache_bytes: int = 0


@dataclass(frozen=True)
class GenerationParams:
    """Sampling parameters; None leaves the server's default (see protos/ortserve.proto)."""

    max_new_tokens: int | None = None
    temperature: float | None = None
    top_k: int = 0
    top_p: float | None = None
    min_p: float = 0.0                # [0, 1]: drop tokens below min_p x the likeliest one's probability
    min_tokens: int = 0               # eos and stop_token_ids cannot end the sequence before this many tokens
    repetition_penalty: float | None = None
    presence_penalty: float = 0.0     # [-2, 2], OpenAI's: once per token generated so far
    frequency_penalty: float = 0.0    # [-2, 2], OpenAI's: per time a token was generated so far
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token id, bias in [-100, 100]); a dict is accepted
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    # Score the prompt: each prompt token's logprob given the ones before it, with this many top alternatives
    # (0..20); None = off. Answers carry them as `prompt_tokens`.
    prompt_logprobs: int | None = None
    truncate_prompt: bool = False
    ignore_eos: bool = False
    # Beam search (decoders and encoder-decoders; not streamed): beams 1..8, the score's length penalty, and when it
    # ends (True, False or "never", as transformers' generate). None leaves the server's default (1 beam, 1.0, False).
    num_beams: int | None = None
    length_penalty: float | None = None
    early_stopping: bool | str | None = None
    # Translation models: the language token to translate into ("fra_Latn", "__fr__", "fr_XX"); sent as
    # GenerateRequest.target_language. None: the model's default.
    target_language: str | None = None
    source_language: str | None = None    # the source text's language token (GenerateRequest.source_language)
    # generate_stream: tokens per chunk after the first (>= 1); raises the server's --stream-interval, never lowers
    # it. max_new_tokens: the first token alone, then the rest with the end. None: the server's.
    stream_interval: int | None = None

    @property
    def wants_logprobs(self) -> bool:
        # top-n alternatives imply the chosen token's logprob too (as on the server).
        return self.logprobs or self.top_logprobs > 0

    @classmethod
    def from_kwargs(cls, params: dict[str, Any]) -> "GenerationParams":
        """Builds parameters from keyword arguments; an unknown name is a TypeError naming it."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise TypeError(f"unknown generation parameter(s): {', '.join(unknown)}")
        values = dict(params)
        for name in ("stop", "stop_token_ids"):
            value = values.get(name)
            if isinstance(value, (str, int)):
                values[name] = (value,)
            elif value is not None:
                values[name] = tuple(value)
        if isinstance(values.get("logit_bias"), dict):
            values["logit_bias"] = tuple(sorted(values["logit_bias"].items()))
        return cls(**{k: v for k, v in values.items() if v is not None})


def to_jsonable(value: Any) -> Any:
    """A result dataclass (or a list of them) as plain JSON-ready data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, list):
        return [to_jsonable(v) for v in value]
    return value
