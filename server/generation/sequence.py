"""One request's life in the engine: its prompt, sampler, text pipeline and output queue."""
from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer

from .detokenize import IncrementalDetokenizer, StopMatcher
from .params import GenerationParams
from .results import GeneratedToken, StreamChunk, TokenLogprob, Usage, merge_chunks
from .sampling import Choice, Sampler

if TYPE_CHECKING:
    from .scheduler import SeqState

_ids = itertools.count(1)


@dataclass
class Sequence:
    prompt_ids: list[int]
    params: GenerationParams
    sampler: Sampler
    detokenizer: IncrementalDetokenizer
    stopper: StopMatcher
    deadline: float | None               # time.monotonic() value
    arrival: float = field(default_factory=time.monotonic)
    id: int = field(default_factory=lambda: next(_ids))
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)   # StreamChunk | BaseException
    generated: list[int] = field(default_factory=list)
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    cancelled: bool = False              # the consumer went away
    state: "SeqState | None" = None      # the slot scheduler's view (in-place-cache engine only)
    # With prompt_logprobs: the prompt's tokens scored so far (the first unscored), until sent with the first token.
    prompt_tokens: list[GeneratedToken] | None = None
    # Encoder-decoder packages: the source's ids (encoded at admission); prompt_ids are then the decoder's own
    # prompt (its start token). None for a decoder.
    source_ids: list[int] | None = None
    # The beams.BeamSearch answering this request (num_beams > 1); typed loosely: beams.py builds on this module.
    search: Any = None
    # An error taken off the queue behind chunks that were merged (next_chunk): raised by the next call.
    held_error: BaseException | None = None
    stream_interval: int = 1             # GenerationConfig.stream_interval
    # Chunks not yet queued (stream_interval > 1): sent with the chunk that completes the interval, or the last.
    held: list[StreamChunk] = field(default_factory=list)
    held_tokens: int = 0                 # the tokens of `held`
    # Collected whole (a unary request): every chunk waits for the final one, so no token costs a queue round trip
    # on the event loop (bench/FINDINGS.md).
    whole: bool = False

    @classmethod
    def create(cls, prompt_ids: list[int], params: GenerationParams, tokenizer: Tokenizer, vocab_size: int,
               deadline: float | None, eos_id: int | None = None, source_ids: list[int] | None = None,
               forced: dict[int, int] | None = None, stream_interval: int = 1,
               constraint: Any = None) -> "Sequence":
        """constraint: the sequence's grammar state (a server.structured TokenConstraint), None without one."""
        return cls(prompt_ids=prompt_ids, params=params,
                   sampler=Sampler(params, vocab_size, prompt_ids, eos_id, forced, constraint),
                   detokenizer=IncrementalDetokenizer(tokenizer, prompt_ids), stopper=StopMatcher(params.stop),
                   deadline=deadline, source_ids=source_ids, stream_interval=stream_interval,
                   prompt_tokens=None if params.prompt_logprobs is None
                   else [GeneratedToken(prompt_ids[0], token=token_text(tokenizer, prompt_ids[0]))])

    async def next_chunk(self) -> StreamChunk:
        """The next chunk; when the consumer fell behind and several wait, all of them as one (merge_chunks).

        Each chunk becomes a message on every door (a gRPC message, an SSE event) whose sending costs the event
        loop and the client more than the token itself: a consumer that is behind catches up in one message, not
        one per token. Raises the error the engine queued (after the chunks queued before it)."""
        if self.held_error is not None:
            error, self.held_error = self.held_error, None
            raise error
        item = await self.queue.get()
        if isinstance(item, BaseException):
            raise item
        chunks = [item]
        while not chunks[-1].final and not self.queue.empty():
            nxt = self.queue.get_nowait()
            if isinstance(nxt, BaseException):
                self.held_error = nxt
                break
            chunks.append(nxt)
        return merge_chunks(chunks)

    def send(self, chunk: StreamChunk) -> None:
        """Queue a chunk for the consumer. With a stream interval n > 1 the first token goes at once (time to first
        token unchanged), later ones wait until n tokens have gathered; the final chunk takes whatever waits."""
        if self.whole:
            self.held.append(chunk)
            self.held_tokens += len(chunk.tokens)
            if not chunk.final:
                return
            chunk, self.held, self.held_tokens = merge_chunks(self.held), [], 0
        elif self.stream_interval > 1:
            self.held.append(chunk)
            self.held_tokens += len(chunk.tokens)
            if not chunk.final and len(self.generated) > 1 and self.held_tokens < self.stream_interval:
                return
            chunk, self.held, self.held_tokens = merge_chunks(self.held), [], 0
        self.queue.put_nowait(chunk)

    def take_prompt_tokens(self) -> list[GeneratedToken]:
        """The scored prompt, once (for the chunk that carries the first generated token); [] afterwards."""
        tokens, self.prompt_tokens = self.prompt_tokens or [], None
        return tokens

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def budget(self) -> int:
        """Tokens this request may occupy: what admission control counts (a source's too)."""
        return len(self.prompt_ids) + self.params.max_new_tokens + len(self.source_ids or ())

    def usage(self) -> Usage:
        """prompt_tokens: the source's for an encoder-decoder (what the caller sent), else the prompt's."""
        prompt = self.prompt_ids if self.source_ids is None else self.source_ids
        return Usage(prompt_tokens=len(prompt), completion_tokens=len(self.generated),
                     cached_prompt_tokens=self.state.reused if self.state is not None else 0)

    def fail(self, error: BaseException) -> None:
        if not self.done:
            self.finish_reason = "error"
            self.finished_at = time.monotonic()
            if self.held:      # what was produced before the failure reaches the consumer first
                self.queue.put_nowait(merge_chunks(self.held))
                self.held, self.held_tokens = [], 0
            self.queue.put_nowait(error)

    def finish(self, reason: str, text: str = "", tokens: list[GeneratedToken] | None = None) -> None:
        """Send the final chunk: flushes held-back text unless a stop sequence ended the text."""
        if self.done:
            return
        if not self.stopper.stopped:
            text += self.stopper.feed(self.detokenizer.flush())
            if self.stopper.stopped:
                reason = "stop"
            text += self.stopper.flush()
        self.finish_reason = reason
        self.finished_at = time.monotonic()
        self.send(StreamChunk(text=text, tokens=tokens or [], final=True, finish_reason=reason, usage=self.usage(),
                              prompt_tokens=self.take_prompt_tokens()))


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """One token decoded alone, special tokens included (may be U+FFFD for part of a UTF-8 character)."""
    return tokenizer.decode([token_id], skip_special_tokens=False)


def to_generated_token(choice: Choice, tokenizer: Tokenizer) -> GeneratedToken:
    """The chosen token with its text, logprob and alternatives, when logprobs were asked for: the text travels
    with the token, decoded by the tokenizer of the version that generated it."""
    if choice.logprob is None:
        return GeneratedToken(token_id=choice.token_id)
    top = tuple(TokenLogprob(token_id=t, token=token_text(tokenizer, t), logprob=lp) for t, lp in choice.top)
    return GeneratedToken(token_id=choice.token_id, logprob=choice.logprob, top_logprobs=top, rank=choice.rank,
                          token=token_text(tokenizer, choice.token_id))
