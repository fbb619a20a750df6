"""What the engine hands back: streamed chunks, the final result, and its errors."""
from __future__ import annotations

from dataclasses import dataclass, field

from protos.results import TokenLogprob, Usage   # the client's too (protos/results.py)

FINISH_LENGTH = "length"
FINISH_EOS = "eos"
FINISH_STOP = "stop"
FINISH_CANCELLED = "cancelled"


class OverloadedError(RuntimeError):
    """The engine's queue or token budget is full; the caller should answer RESOURCE_EXHAUSTED."""


class EngineStoppedError(RuntimeError):
    """The engine is not running (never started, or stopped); the caller should answer UNAVAILABLE."""


@dataclass(frozen=True)
class GeneratedToken:
    token_id: int
    logprob: float | None = None                      # set when logprobs (or top_logprobs) was asked for
    top_logprobs: tuple[TokenLogprob, ...] = ()       # best first
    rank: int | None = None                           # scored prompt tokens: 1 + how many tokens were likelier
    # The token decoded alone (as TokenLogprob.token), by the version that produced it: set with logprob, and on a
    # scored prompt's first token; "" otherwise.
    token: str = ""


@dataclass(frozen=True)
class StreamChunk:
    """Text produced since the previous chunk (never a partial character) and the tokens behind it.

    Text may lag its tokens: text that could still become a stop sequence or a multi-byte character
    is held back until it is decided. `final` chunks carry finish_reason and usage.
    """

    text: str
    tokens: list[GeneratedToken] = field(default_factory=list)
    final: bool = False
    finish_reason: str | None = None
    usage: Usage | None = None
    # With prompt_logprobs: one per prompt token (the first has no logprob: nothing precedes it), on the chunk
    # of the first generated token.
    prompt_tokens: list[GeneratedToken] = field(default_factory=list)


def merge_chunks(chunks: list[StreamChunk]) -> StreamChunk:
    """Consecutive chunks of one sequence as one: texts and tokens in order, the end (finish reason, usage) of the
    last. What a consumer reassembles from it equals what it would from the chunks one by one."""
    if len(chunks) == 1:
        return chunks[0]
    last = chunks[-1]
    return StreamChunk(text="".join(c.text for c in chunks), tokens=[t for c in chunks for t in c.tokens],
                       final=last.final, finish_reason=last.finish_reason, usage=last.usage,
                       prompt_tokens=[t for c in chunks for t in c.prompt_tokens])


@dataclass(frozen=True)
class GenerationResult:
    text: str
    finish_reason: str
    usage: Usage
    tokens: list[GeneratedToken]
    time_to_first_token_ms: float
    total_time_ms: float
    prompt_tokens: list[GeneratedToken] = field(default_factory=list)   # with prompt_logprobs (see StreamChunk)
