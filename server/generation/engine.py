"""The generation engine's request side, shared by both cache layouts.

`GenerationEngine(session, manifest, tokenizer, ...)` gives the engine the package's cache layout needs:
  - "inplace" (model.json cache.layout): SlotEngine — slot scheduler, cache written in place, chunked prefill;
  - "concat" (packages published before the in-place graph): ConcatEngine — the batch cache grown by the graph.
Both share what a request sees: prompt validation, admission control, streaming chunks, sampling, stop
handling, deadlines and metrics. A subclass supplies the iteration loop.

onnxruntime runs in the engine's own single worker thread, so the event loop keeps serving meanwhile.
Deadlines (time.monotonic() values): a request whose deadline passes before its prefill raises
TimeoutError from `stream`/`generate` and is never computed; a running one ends with finish_reason
"cancelled" and keeps the text produced so far.
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterable

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from .params import GenerationConfig, GenerationParams
from .results import (FINISH_CANCELLED, FINISH_EOS, FINISH_LENGTH, FINISH_STOP, EngineStoppedError,
                      GenerationResult, OverloadedError, StreamChunk)
from .sequence import Sequence, to_generated_token
from .spec import DecoderSpec

if TYPE_CHECKING:
    from server.metrics import Metrics

logger = logging.getLogger(__name__)


def _unpadded(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer itself, or a copy without padding/truncation (they would corrupt prompt ids)."""
    if tokenizer.padding is None and tokenizer.truncation is None:
        return tokenizer
    logger.info("generation: using a copy of the tokenizer with padding and truncation turned off")
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_padding()
    copy.no_truncation()
    return copy


def _layout(manifest: dict[str, Any]) -> str:
    cache = manifest.get("cache") if isinstance(manifest, dict) else None
    return cache.get("layout", "concat") if isinstance(cache, dict) else "concat"


class GenerationEngine:
    gives_prompt_logprobs = False   # whether every prompt position's logits come back (prompt_logprobs)

    def __new__(cls, session: ort.InferenceSession, manifest: dict[str, Any], *args: Any, **kwargs: Any):
        if cls is GenerationEngine:
            from .concat_engine import ConcatEngine
            from .slot_engine import SlotEngine
            cls = SlotEngine if _layout(manifest) == "inplace" else ConcatEngine
        return super().__new__(cls)

    def __init__(self, session: ort.InferenceSession, manifest: dict[str, Any], tokenizer: Tokenizer,
                 config: GenerationConfig | None = None, metrics: "Metrics | None" = None,
                 model_label: str = "model", mixed_session: ort.InferenceSession | None = None) -> None:
        """mixed_session: an in-place package's mixed graph (cache.mixed_graphs: decode rows and a prompt chunk
        in one run); without it they run one after the other."""
        if mixed_session is not None and _layout(manifest) != "inplace":
            raise ValueError("mixed_session: only an in-place-cache package has a mixed graph")
        self._mixed_session = mixed_session
        self.session = session
        self.spec = DecoderSpec.from_package(manifest, session)
        self.config = config or GenerationConfig()
        self._tokenizer = _unpadded(tokenizer)
        self._metrics = metrics
        self._label = model_label
        # Labelled children looked up once: labels() locks and builds a key per call, and these run per token.
        self._per_model = None if metrics is None else _ModelMetrics(metrics, model_label)
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._executor: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ what a subclass supplies

    @property
    def active_sequences(self) -> int:
        """Sequences holding a place in the running batch (not counting waiting ones)."""
        raise NotImplementedError

    @property
    def waiting_requests(self) -> int:
        raise NotImplementedError

    def warmup(self) -> None:
        """Run the graph the way serving will; raises on any failure."""
        raise NotImplementedError

    def _sequences(self) -> Iterable[Sequence]:
        """Every waiting or running request."""
        raise NotImplementedError

    def _enqueue(self, seq: Sequence) -> None:
        raise NotImplementedError

    def _dequeue_waiting(self, seq: Sequence) -> bool:
        """Remove a request that has not started; False when it already runs."""
        raise NotImplementedError

    def _has_work(self) -> bool:
        raise NotImplementedError

    def _retire(self) -> None:
        """Drop sequences that are done, cancelled, or past their deadline."""
        raise NotImplementedError

    async def _iterate(self) -> bool:
        """One iteration: admit, prefill, decode. True when it ran the graph (awaited the worker thread)."""
        raise NotImplementedError

    def _clear(self) -> None:
        """Forget every sequence (after they were failed or finished)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ lifecycle

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        if self.running:
            return
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"generate-{self._label}")
        self._task = asyncio.create_task(self._loop(), name=f"generation-loop-{self._label}")
        logger.info("generation engine %s started (%s, max_batch_size=%d)", self._label, type(self).__name__,
                    self.config.max_batch_size)

    async def stop(self) -> None:
        """Stop the loop; every waiting or running request ends with finish_reason "cancelled"."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        for seq in list(self._sequences()):
            seq.finish(FINISH_CANCELLED)
        self._clear()
        if self._executor is not None:
            # A step still running in the thread finishes on its own; do not block the event loop on it.
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        self._record_gauges()
        logger.info("generation engine %s stopped", self._label)

    # ------------------------------------------------------------------ requests

    async def stream(self, prompt: str | list[int], params: GenerationParams,
                     deadline: float | None = None) -> AsyncIterator[StreamChunk]:
        """Chunks as tokens are produced; the last one has final=True. Closing it early cancels the request.

        Raises ValueError (bad prompt/parameters, naming the field), OverloadedError, TimeoutError,
        EngineStoppedError, or RuntimeError when the graph fails.
        """
        seq = self._submit(prompt, params, deadline)
        try:
            while True:
                chunk = await self._next_chunk(seq)
                yield chunk
                if chunk.final:
                    return
        finally:
            # Closed early, cancelled, or failed: free the slot now (not when the generator is collected).
            if not seq.done:
                self._abandon(seq)

    async def generate(self, prompt: str | list[int], params: GenerationParams,
                       deadline: float | None = None) -> GenerationResult:
        """The whole completion; same errors as `stream`. Cancelling the awaiting task cancels the request."""
        seq = self._submit(prompt, params, deadline)
        texts: list[str] = []
        tokens, prompt_tokens = [], []
        try:
            while True:
                chunk = await self._next_chunk(seq)
                texts.append(chunk.text)
                tokens.extend(chunk.tokens)
                prompt_tokens.extend(chunk.prompt_tokens)
                if chunk.final:
                    break
        finally:
            if not seq.done:
                self._abandon(seq)
        if chunk.finish_reason is None or chunk.usage is None:
            raise RuntimeError("generation: the final chunk carries no finish reason")
        end = seq.finished_at or time.monotonic()
        ttft = (seq.first_token_at - seq.arrival) * 1000 if seq.first_token_at is not None else 0.0
        return GenerationResult(text="".join(texts), finish_reason=chunk.finish_reason, usage=chunk.usage,
                                tokens=tokens, time_to_first_token_ms=ttft, total_time_ms=(end - seq.arrival) * 1000,
                                prompt_tokens=prompt_tokens)

    def encode_prompt(self, prompt: str | list[int], params: GenerationParams) -> list[int]:
        """Prompt ids (from text, or given as token ids) that fit the context with max_new_tokens, or ValueError
        naming the field."""
        if not isinstance(params, GenerationParams):
            raise TypeError("params must be a GenerationParams (use GenerationParams.validate)")
        spec = self.spec
        if isinstance(prompt, str):
            ids = self.tokenize(prompt, params.truncate_prompt)
        elif isinstance(prompt, list):
            ids = self._token_prompt(prompt, params)
        else:
            raise ValueError(f"prompt: must be a string or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            start = spec.bos_id if spec.bos_id is not None else spec.eos_id
            if start is None:
                raise ValueError("prompt: must not be empty (the model has no bos/eos token to start from)")
            ids = [start]
        context, wanted = spec.max_length, params.max_new_tokens
        if wanted >= context:
            raise ValueError(f"parameters.max_new_tokens: must be < the model's context of {context} tokens "
                             f"(room for at least one prompt token), got {wanted}")
        room = context - wanted
        if len(ids) > room:
            if not params.truncate_prompt:
                raise ValueError(f"prompt: {len(ids)} tokens + parameters.max_new_tokens {wanted} exceed the model's "
                                 f"context of {context} tokens (shorten it, lower max_new_tokens, or set truncate_prompt)")
            ids = ids[-room:]
        for i, token in enumerate(params.stop_token_ids):
            if token >= spec.vocab_size:
                raise ValueError(f"parameters.stop_token_ids[{i}]: {token} is outside the vocabulary "
                                 f"(size {spec.vocab_size})")
        for token, _ in params.logit_bias:
            if token >= spec.vocab_size:
                raise ValueError(f"parameters.logit_bias: token {token} is outside the vocabulary "
                                 f"(size {spec.vocab_size})")
        if params.prompt_logprobs is not None and not self.gives_prompt_logprobs:
            raise ValueError("parameters.prompt_logprobs: this model's package has the concat cache layout, whose "
                             "engine keeps no prompt logits; re-export it (the default in-place cache gives them)")
        return ids

    def tokenize(self, text: str, truncate: bool = False) -> list[int]:
        """The ids of a text prompt, as generation makes them (before fitting them to the context).

        The last `context` tokens of a text lie within its last (context + 1) * 100 characters (no token covers
        more), so a longer text is refused (or, with `truncate`, cut) before tokenizing: tokenizing megabytes
        would hold the event loop for seconds."""
        max_chars = (self.spec.max_length + 1) * 100
        if len(text) > max_chars:
            if not truncate:
                raise ValueError(f"prompt: {len(text)} characters cannot fit the model's context of "
                                 f"{self.spec.max_length} tokens (shorten it, or set truncate_prompt)")
            text = text[-max_chars:]
        return list(self._tokenizer.encode(text).ids) if text else []

    def detokenize(self, token_ids: list[int]) -> str:
        """The text of token ids, each checked against the vocabulary (ValueError naming `tokens[i]`)."""
        _check_token_ids(token_ids, self.spec.vocab_size, "tokens")
        return self._tokenizer.decode(token_ids, skip_special_tokens=False)

    def _token_prompt(self, prompt: list[int], params: GenerationParams) -> list[int]:
        vocab, context = self.spec.vocab_size, self.spec.max_length
        first = 0
        if len(prompt) > context:      # only the tail that can fit is checked (the list may be huge)
            if not params.truncate_prompt:
                raise ValueError(f"prompt: {len(prompt)} tokens cannot fit the model's context of {context} tokens "
                                 "(shorten it, or set truncate_prompt)")
            first = len(prompt) - context
        _check_token_ids(prompt[first:], vocab, "prompt", first)
        return list(prompt[first:])

    def _submit(self, prompt: str | list[int], params: GenerationParams, deadline: float | None) -> Sequence:
        if not self.running:
            raise EngineStoppedError(f"generation engine {self._label} is not running")
        ids = self.encode_prompt(prompt, params)
        if deadline is not None and deadline <= time.monotonic():
            raise TimeoutError("deadline passed before generation started")
        cfg = self.config
        if self.waiting_requests >= cfg.max_waiting:
            raise OverloadedError(f"generation queue of {self._label} is full ({cfg.max_waiting} waiting)")
        budget = len(ids) + params.max_new_tokens
        if budget > cfg.max_tokens_in_flight:   # would be refused whatever the load: not worth a retry
            raise ValueError(f"parameters.max_new_tokens: prompt {len(ids)} tokens + max_new_tokens "
                             f"{params.max_new_tokens} = {budget} exceed max_tokens_in_flight {cfg.max_tokens_in_flight} "
                             "(this request can never be admitted; lower max_new_tokens or shorten the prompt)")
        in_flight = sum(s.budget for s in self._sequences())
        if in_flight + budget > cfg.max_tokens_in_flight:
            raise OverloadedError(f"generation of {self._label} is at capacity: {in_flight} tokens in flight, "
                                  f"this request needs {budget}, the limit is {cfg.max_tokens_in_flight}")
        seq = Sequence.create(ids, params, self._tokenizer, self.spec.vocab_size, deadline, self.spec.eos_id)
        self._enqueue(seq)
        self._record_gauges()
        self._kick()
        return seq

    @staticmethod
    async def _next_chunk(seq: Sequence) -> StreamChunk:
        item = await seq.queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def _abandon(self, seq: Sequence) -> None:
        """The consumer went away: a waiting request leaves now, a running one at the next iteration."""
        seq.cancelled = True
        if self._dequeue_waiting(seq):
            seq.finish_reason = FINISH_CANCELLED
        self._record_gauges()
        self._kick()

    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # ------------------------------------------------------------------ the loop

    async def _loop(self) -> None:
        if self._wake is None:
            raise RuntimeError("generation loop started without start()")
        while True:
            ran = False
            try:
                self._retire()
                if not self._has_work():
                    self._record_gauges()  # the last retire must show up before idling
                    self._wake.clear()
                    await self._wake.wait()
                    await self._settle_arrivals()
                    continue
                ran = await self._iterate()
            except asyncio.CancelledError:
                raise
            except Exception as exc:   # a bug here must not leave consumers waiting forever
                logger.exception("generation loop of %s failed; failing its requests", self._label)
                for seq in list(self._sequences()):
                    seq.fail(RuntimeError(f"generation failed: {exc}"))
                self._clear()
            self._record_gauges()
            # No yield between steps: consumers take their chunks (and gRPC sends them) while the NEXT step
            # computes, since the loop is free while it awaits the worker thread. Only an iteration that ran
            # nothing yields here, so the loop never spins without letting others run.
            if not ran:
                await asyncio.sleep(0)

    async def _settle_arrivals(self) -> None:
        """Woken from idle: requests sent in the same instant reach the engine a few hundred microseconds apart
        (each is parsed and tokenized on this loop first). Wait while they keep coming, until none came for a
        millisecond or arrival_window_ms passed, so they are prefilled together instead of the first alone and
        the rest one by one beside it. The quiet millisecond is read from the clock, not counted in sleeps: a
        loop's timer can fire early (a 1 ms sleep on uvloop was seen to return after 0.16 ms)."""
        last = time.monotonic()
        end = last + self.config.arrival_window_ms / 1000
        seen = self.waiting_requests
        while True:
            await asyncio.sleep(0.001)
            now = time.monotonic()
            if self.waiting_requests != seen:
                seen, last = self.waiting_requests, now
            if now - last >= 0.001 or now >= end:
                return

    async def _in_thread(self, fn, *args):
        if self._executor is None:
            raise EngineStoppedError(f"generation engine {self._label} is not running")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _deadline_passed(self, seq: Sequence, now: float) -> bool:
        return seq.deadline is not None and seq.deadline <= now

    def _advance(self, seq: Sequence, logits: np.ndarray) -> None:
        """Choose the sequence's next token and send it (with its text, if complete) to the consumer."""
        choice = seq.sampler.choose(logits)
        token = choice.token_id
        seq.sampler.observe(token)
        seq.generated.append(token)
        self._record_token(seq)
        generated = to_generated_token(choice, self._tokenizer)
        params = seq.params
        # eos and stop-token ids end the sequence; their text is not part of the output.
        if token == self.spec.eos_id and not params.ignore_eos:
            seq.finish(FINISH_EOS, tokens=[generated])
            return
        if token in params.stop_token_ids:
            seq.finish(FINISH_STOP, tokens=[generated])
            return
        text = seq.stopper.feed(seq.detokenizer.push(token))
        if seq.stopper.stopped:
            seq.finish(FINISH_STOP, text, [generated])
        elif len(seq.generated) >= params.max_new_tokens:
            seq.finish(FINISH_LENGTH, text, [generated])
        else:
            seq.queue.put_nowait(StreamChunk(text=text, tokens=[generated], prompt_tokens=seq.take_prompt_tokens()))

    # ------------------------------------------------------------------ metrics

    def _record_token(self, seq: Sequence) -> None:
        now = time.monotonic()
        m = self._per_model
        if m is not None:
            m.generated_tokens.inc()
            if seq.first_token_at is None:
                m.time_to_first_token.observe(now - seq.arrival)
            else:
                m.inter_token_latency.observe(now - (seq.last_token_at or now))
        if seq.first_token_at is None:
            seq.first_token_at = now
        seq.last_token_at = now

    def _record_gauges(self) -> None:
        m = self._per_model
        if m is not None:
            m.active_sequences.set(self.active_sequences)
            m.queued_requests.set(self.waiting_requests)
            m.tokens_in_flight.set(sum(s.budget for s in self._sequences()))

    def _check_logits(self, logits: np.ndarray, batch: int, what: str) -> None:
        if logits.ndim != 2 or logits.shape[0] != batch or logits.shape[1] < self.spec.vocab_size:
            raise RuntimeError(f"warmup {what}: logits have shape {logits.shape}, expected "
                               f"[{batch}, >= vocab_size {self.spec.vocab_size}]")
        if not np.isfinite(logits).all():
            raise RuntimeError(f"warmup {what}: logits are not finite")


class _ModelMetrics:
    """One model's children of the engine's metrics (server/metrics.py)."""

    def __init__(self, metrics: "Metrics", label: str) -> None:
        self.generated_tokens = metrics.generated_tokens.labels(model=label)
        self.time_to_first_token = metrics.time_to_first_token.labels(model=label)
        self.inter_token_latency = metrics.inter_token_latency.labels(model=label)
        self.active_sequences = metrics.active_sequences.labels(model=label)
        self.queued_requests = metrics.queued_requests.labels(model=label)
        self.tokens_in_flight = metrics.tokens_in_flight.labels(model=label)
        # Per step (per token at batch 1): looked up once, since labels() locks and builds a key on every call.
        self.batch_size = metrics.batch_size.labels(model=label)
        self.prefill_chunks = metrics.prefill_chunks.labels(model=label)
        self.prefill_tokens = metrics.prefill_tokens.labels(model=label)
        self.prefix_reused_tokens = metrics.prefix_reused_tokens.labels(model=label)
        self.slots_used = metrics.cache_slots.labels(model=label, state="used")
        self.slots_total = metrics.cache_slots.labels(model=label, state="total")


def _check_token_ids(ids: list[Any], vocab: int, name: str, offset: int = 0) -> None:
    """ValueError naming `name[i]` for the first entry that is not a token id of the vocabulary."""
    for i, token in enumerate(ids, start=offset):
        if isinstance(token, bool) or not isinstance(token, int):
            raise ValueError(f"{name}[{i}]: must be a token id, got {type(token).__name__}")
        if not 0 <= token < vocab:
            raise ValueError(f"{name}[{i}]: token id {token} is outside the vocabulary (size {vocab})")
