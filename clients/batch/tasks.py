"""What a batch run asks of each record, and the JSON payload written for its answer.

The payload is the same whichever runner produced the answer (server, --local, Ray), so outputs
of the three can be compared byte for byte. Timing fields are left out on purpose: they differ
on every run and would make a resumed run differ from an uninterrupted one.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from ..types import Classification, FillMaskResult, GeneratedToken, Generation, GenerationParams
from .input import Record

TASKS = ("classify", "fill-mask", "generate", "embed")


@dataclass(frozen=True)
class TaskConfig:
    task: str
    model: str
    version: int | None = None
    top_k: int | None = None      # classify: labels per record (0 = all); fill-mask: candidates per mask
    truncate: bool = False
    generation: GenerationParams = field(default_factory=GenerationParams)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task: expected one of {', '.join(TASKS)}, got {self.task!r}")
        if not self.model:
            raise ValueError("model: must not be empty")

    @property
    def effective_top_k(self) -> int:
        if self.top_k is not None:
            return self.top_k
        return 5 if self.task == "fill-mask" else 0


class Runner(Protocol):
    """Answers one record; raises OrtserveError (code + message) when it cannot."""

    async def run(self, record: Record) -> dict[str, Any]: ...

    async def close(self) -> None: ...


def classification_payload(result: Classification) -> dict[str, Any]:
    return asdict(result)


def fill_mask_payload(result: FillMaskResult) -> dict[str, Any]:
    return asdict(result)


def embedding_payload(values: list[float], tokens: int) -> dict[str, Any]:
    return {"embedding": values, "tokens": tokens}


def generation_payload(result: Generation, with_tokens: bool) -> dict[str, Any]:
    """Written by hand rather than with dataclasses.asdict, whose recursive copy was a tenth of the event loop's
    time in a batch job of short generations (py-spy, g2p); same keys in the same order."""
    u = result.usage
    payload: dict[str, Any] = {"text": result.text, "finish_reason": result.finish_reason,
                               "usage": {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                                         "cached_prompt_tokens": u.cached_prompt_tokens}}
    if with_tokens:
        payload["tokens"] = [_token(t) for t in result.tokens]
    if result.prompt_tokens:     # asked for with prompt_logprobs
        payload["prompt_tokens"] = [_token(t) for t in result.prompt_tokens]
    return payload


def _token(t: GeneratedToken) -> dict[str, Any]:
    return {"token_id": t.token_id, "logprob": t.logprob,
            "top_logprobs": [{"token_id": a.token_id, "token": a.token, "logprob": a.logprob} for a in t.top_logprobs]}
