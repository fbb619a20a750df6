"""One request's life in the engine: its prompt, sampler, text pipeline and output queue.

The token list beside the text (docs/protocol.md, "Tokens beside the text"): a response's tokens are exactly the
tokens whose text is in its output, in order, and last the token that ended it without text of its own (eos, a stop
id). A token goes out with the chunk that releases its text, so a token whose text a stop string may still remove
waits with that text (`ledger`); when a stop string ends the output, the tokens wholly inside it (or past it) are
dropped with their text, and one in which it begins stays. With ignore_eos, eos is an ordinary token: the text keeps
its (special) text, as every special token's.
"""
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
from .strategies import SAMPLING, Strategy

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
    strategy: Strategy = SAMPLING        # how its rows choose (strategies.py); its beams choose for a beam search
    # An error taken off the queue behind chunks that were merged (next_chunk): raised by the next call.
    held_error: BaseException | None = None
    stream_interval: int = 1             # GenerationConfig.stream_interval
    # Chunks not yet queued (stream_interval > 1): sent with the chunk that completes the interval, or the last.
    held: list[StreamChunk] = field(default_factory=list)
    held_tokens: int = 0                 # the tokens of `held`
    # Collected whole (a unary request): every chunk waits for the final one, so no token costs a queue round trip
    # on the event loop (bench/FINDINGS.md).
    whole: bool = False
    # A `quiet` request's tokens (whole, or streamed in intervals, without stop strings), kept without text until
    # their chunk goes out, when they go through the detokenizer together (`catch_up`): nobody reads it before then.
    deferred: list[GeneratedToken] = field(default_factory=list)
    # Generated tokens not yet sent, each with where its text starts and ends in the text produced so far;
    # `released`: how much of that text the stop matcher let out.
    ledger: list[tuple[GeneratedToken, int, int]] = field(default_factory=list)
    produced: int = 0
    released: int = 0

    @classmethod
    def create(cls, prompt_ids: list[int], params: GenerationParams, tokenizer: Tokenizer, vocab_size: int,
               deadline: float | None, eos_id: int | None = None, source_ids: list[int] | None = None,
               forced: dict[int, int] | None = None, stream_interval: int = 1,
               constraint: Any = None) -> "Sequence":
        """constraint: the sequence's grammar state (a server.structured TokenConstraint), None without one."""
        return cls(prompt_ids=prompt_ids, params=params,
                   sampler=Sampler(params, vocab_size, prompt_ids, eos_id, forced, constraint),
                   detokenizer=IncrementalDetokenizer(tokenizer, prompt_ids,
                                                      skip_special_tokens=not params.ignore_eos),
                   stopper=StopMatcher(params.stop),
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
            if not chunk.final and self.past_first and self.held_tokens < self.stream_interval:
                return
            chunk, self.held, self.held_tokens = merge_chunks(self.held), [], 0
        self.queue.put_nowait(chunk)

    def add_text(self, token: GeneratedToken, text: str) -> str:
        """A generated token and the text it produced (detokenized, not yet stop-matched) -> the text released now;
        the token joins the ledger."""
        self.ledger.append((token, self.produced, self.produced + len(text)))
        self.produced += len(text)
        return self._release(self.stopper.feed(text))

    def take_released(self) -> list[GeneratedToken]:
        """The ledger's tokens whose text is all released (they go with the chunk that carries it)."""
        n = 0
        while n < len(self.ledger) and self.ledger[n][2] <= self.released:
            n += 1
        out, self.ledger = [t for t, _, _ in self.ledger[:n]], self.ledger[n:]
        return out

    def _release(self, text: str) -> str:
        self.released += len(text)
        return text

    def take_prompt_tokens(self) -> list[GeneratedToken]:
        """The scored prompt, once (for the chunk that carries the first generated token); [] afterwards."""
        tokens, self.prompt_tokens = self.prompt_tokens or [], None
        return tokens

    @property
    def quiet(self) -> bool:
        """Nobody reads the text of its next token before later ones': collected whole, or streamed in intervals
        past its first token (stream_interval > 1) — with no stop string to match. Such tokens wait without text
        (outputs.emit_token) until a chunk goes out: the end, or an interval's worth (`interval_full`)."""
        if self.params.stop:
            return False
        return self.whole or (self.stream_interval > 1 and self.past_first)

    @property
    def past_first(self) -> bool:
        """Its first generated token is behind it: a streamed sequence's first token goes out at once, whatever its
        interval (time to first token unchanged); the ones after it wait for their interval."""
        return len(self.generated) > 1

    def interval_full(self) -> bool:
        """A streamed sequence's deferred tokens with those held complete an interval: their chunk goes now."""
        return not self.whole and len(self.deferred) + self.held_tokens >= self.stream_interval

    def send_released(self, text: str) -> None:
        """Text released now with the tokens whose text is all out, as a chunk (held or sent as `send` decides);
        nothing when there is neither (a stop string may still take the text of the last token)."""
        released = self.take_released()
        if text or released:
            self.send(StreamChunk(text=text, tokens=released, prompt_tokens=self.take_prompt_tokens()))

    def catch_up(self) -> str:
        """The deferred tokens through the detokenizer and the ledger: the text they release, as their steps would
        have released it. Decoded together when their text ends on a whole character (one decode instead of one per
        token); then the text is the last token's in the ledger, the others' empty — with no stop string, which
        `quiet` requires, nothing cuts between them and they all go out with it. Else one by one."""
        if not self.deferred:
            return ""
        tokens, self.deferred = self.deferred, []
        text = self.detokenizer.push_many([token.token_id for token in tokens])
        if text is not None:
            self.ledger.extend((token, self.produced, self.produced) for token in tokens[:-1])
            return self.add_text(tokens[-1], text)
        push, add = self.detokenizer.push, self.add_text
        return "".join([add(token, push(token.token_id)) for token in tokens])

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def source_states(self) -> "list[SeqState]":
        """The states that read this request's source (an encoder-decoder's): its own."""
        return [self.state] if self.state is not None else []

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
            if self.deferred:      # its tokens waiting without text become a chunk, as the held ones
                self.send_released(self.catch_up())
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
        text = self.catch_up() + text
        if not self.stopper.stopped:
            rest = self.detokenizer.flush()
            if self.ledger:     # the text the detokenizer held is its last tokens'
                token, start, end = self.ledger[-1]
                self.ledger[-1] = (token, start, end + len(rest))
            self.produced += len(rest)
            text += self._release(self.stopper.feed(rest))
            if self.stopper.stopped:
                reason = "stop"
            text += self._release(self.stopper.flush())
        # Stopped by a stop string: the tokens that begin past the cut are not in the output.
        kept = [t for t, start, _ in self.ledger if start < self.released or not self.stopper.stopped]
        self.ledger = []
        self.finish_reason = reason
        self.finished_at = time.monotonic()
        self.send(StreamChunk(text=text, tokens=kept + (tokens or []), final=True, finish_reason=reason,
                              usage=self.usage(), prompt_tokens=self.take_prompt_tokens()))


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
