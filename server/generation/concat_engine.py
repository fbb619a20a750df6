"""Continuous-batching generation over one KV-cache decoder graph.

One background task runs the step loop. Each iteration:
  1. drops sequences that finished, were cancelled by their consumer, or ran past their deadline;
  2. admits waiting requests into free batch slots and prefills them together (left-padded, past 0);
  3. runs ONE decode step for every active sequence (the just-prefilled ones included).
onnxruntime runs in the engine's own single worker thread, so the event loop keeps serving meanwhile.

Deadlines (time.monotonic() values): a request whose deadline passes before its prefill raises
TimeoutError from `stream`/`generate` and is never computed; a running one ends with finish_reason
"cancelled" and keeps the text produced so far.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from typing import TYPE_CHECKING, Any, AsyncIterator

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from .kvcache import BatchCache
from .params import GenerationConfig, GenerationParams
from .results import (FINISH_CANCELLED, FINISH_EOS, FINISH_LENGTH, FINISH_STOP, EngineStoppedError,
                      GenerationResult, OverloadedError, StreamChunk)
from .runner import DecoderRunner
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


class GenerationEngine:
    def __init__(self, session: ort.InferenceSession, manifest: dict[str, Any], tokenizer: Tokenizer,
                 config: GenerationConfig | None = None, metrics: "Metrics | None" = None,
                 model_label: str = "model") -> None:
        self.spec = DecoderSpec.from_package(manifest, session)
        self.config = config or GenerationConfig()
        self._runner = DecoderRunner(session, self.spec)
        self._tokenizer = _unpadded(tokenizer)
        self._metrics = metrics
        self._label = model_label
        self._waiting: deque[Sequence] = deque()
        self._active: list[Sequence] = []    # same order as the cache rows
        self._cache: BatchCache | None = None
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._executor: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ public API

    @property
    def active_sequences(self) -> int:
        """Sequences in the running batch (not counting waiting ones)."""
        return len(self._active)

    @property
    def waiting_requests(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        if self.running:
            return
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"generate-{self._label}")
        self._task = asyncio.create_task(self._loop(), name=f"generation-loop-{self._label}")
        logger.info("generation engine %s started (max_batch_size=%d)", self._label, self.config.max_batch_size)

    async def stop(self) -> None:
        """Stop the loop; every waiting or running request ends with finish_reason "cancelled"."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        for seq in chain(self._waiting, self._active):
            seq.finish(FINISH_CANCELLED)
        self._waiting.clear()
        self._active.clear()
        self._cache = None
        if self._executor is not None:
            # A step still running in the thread finishes on its own; do not block the event loop on it.
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        self._record_gauges()
        logger.info("generation engine %s stopped", self._label)

    async def stream(self, prompt: str, params: GenerationParams,
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

    async def generate(self, prompt: str, params: GenerationParams,
                       deadline: float | None = None) -> GenerationResult:
        """The whole completion; same errors as `stream`. Cancelling the awaiting task cancels the request."""
        seq = self._submit(prompt, params, deadline)
        texts: list[str] = []
        tokens = []
        try:
            while True:
                chunk = await self._next_chunk(seq)
                texts.append(chunk.text)
                tokens.extend(chunk.tokens)
                if chunk.final:
                    break
        finally:
            if not seq.done:
                self._abandon(seq)
        assert chunk.finish_reason is not None and chunk.usage is not None
        end = seq.finished_at or time.monotonic()
        ttft = (seq.first_token_at - seq.arrival) * 1000 if seq.first_token_at is not None else 0.0
        return GenerationResult(text="".join(texts), finish_reason=chunk.finish_reason, usage=chunk.usage,
                                tokens=tokens, time_to_first_token_ms=ttft, total_time_ms=(end - seq.arrival) * 1000)

    def warmup(self) -> None:
        """Prefill (past 0) and one step at batch 1 and 2 (one row left-padded); raises on any failure."""
        start = next((t for t in (self.spec.bos_id, self.spec.eos_id) if t is not None), 0)
        for prompts in ([[start]], [[start, start, start], [start]]):
            logits, cache = self._runner.prefill(prompts)
            self._check_logits(logits, len(prompts), "prefill")
            logits, cache = self._runner.step(cache, np.argmax(logits, axis=1))
            self._check_logits(logits, len(prompts), "step")

    # ------------------------------------------------------------------ admission

    def encode_prompt(self, prompt: str, params: GenerationParams) -> list[int]:
        """Prompt ids that fit the context with max_new_tokens, or ValueError naming the field."""
        if not isinstance(prompt, str):
            raise ValueError(f"prompt: must be a string, got {type(prompt).__name__}")
        if not isinstance(params, GenerationParams):
            raise TypeError("params must be a GenerationParams (use GenerationParams.validate)")
        spec = self.spec
        # The last `context` tokens of a prompt lie within its last (context + 1) * 100 characters (no token
        # covers more), so a longer prompt is refused or cut before tokenizing: tokenizing megabytes would hold
        # the event loop for seconds.
        max_chars = (spec.max_length + 1) * 100
        if len(prompt) > max_chars:
            if not params.truncate_prompt:
                raise ValueError(f"prompt: {len(prompt)} characters cannot fit the model's context of "
                                 f"{spec.max_length} tokens (shorten it, or set truncate_prompt)")
            prompt = prompt[-max_chars:]
        ids = list(self._tokenizer.encode(prompt).ids) if prompt else []
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
        return ids

    def _submit(self, prompt: str, params: GenerationParams, deadline: float | None) -> Sequence:
        if not self.running:
            raise EngineStoppedError(f"generation engine {self._label} is not running")
        ids = self.encode_prompt(prompt, params)
        if deadline is not None and deadline <= time.monotonic():
            raise TimeoutError("deadline passed before generation started")
        cfg = self.config
        if len(self._waiting) >= cfg.max_waiting:
            raise OverloadedError(f"generation queue of {self._label} is full ({cfg.max_waiting} waiting)")
        budget = len(ids) + params.max_new_tokens
        in_flight = sum(s.budget for s in chain(self._waiting, self._active))
        if in_flight + budget > cfg.max_tokens_in_flight:
            raise OverloadedError(f"generation of {self._label} is at capacity: {in_flight} tokens in flight, "
                                  f"this request needs {budget}, the limit is {cfg.max_tokens_in_flight}")
        seq = Sequence.create(ids, params, self._tokenizer, self.spec.vocab_size, deadline)
        self._waiting.append(seq)
        self._record_gauges()
        assert self._wake is not None
        self._wake.set()
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
        try:
            self._waiting.remove(seq)
            seq.finish_reason = FINISH_CANCELLED
        except ValueError:
            pass
        self._record_gauges()
        if self._wake is not None:
            self._wake.set()

    # ------------------------------------------------------------------ the step loop

    async def _loop(self) -> None:
        assert self._wake is not None
        while True:
            try:
                self._retire()
                if not self._active and not self._waiting:
                    self._record_gauges()  # (server core) the last retire must show up before idling
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                admitted = self._admit()
                if admitted:
                    await self._prefill(admitted)
                if self._active:
                    await self._step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:   # a bug here must not leave consumers waiting forever
                logger.exception("generation loop of %s failed; failing its requests", self._label)
                for seq in chain(self._waiting, self._active):
                    seq.fail(RuntimeError(f"generation failed: {exc}"))
                self._waiting.clear()
                self._active.clear()
                self._cache = None
            self._record_gauges()
            await asyncio.sleep(0)   # let consumers take their chunks between steps

    def _retire(self) -> None:
        """Drop rows that are done, cancelled, or past their deadline."""
        now = time.monotonic()
        for seq in self._active:
            if seq.cancelled and not seq.done:
                seq.finish_reason = FINISH_CANCELLED    # nobody listens: no chunk
            elif seq.deadline is not None and seq.deadline <= now:
                seq.finish(FINISH_CANCELLED)
        keep = [row for row, seq in enumerate(self._active) if not seq.done]
        if len(keep) == len(self._active):
            return
        self._active = [self._active[row] for row in keep]
        self._cache = self._cache.select(keep) if keep and self._cache is not None else None

    def _admit(self) -> list[Sequence]:
        """Waiting requests for the free slots, within the prefill token budget (at least one)."""
        now = time.monotonic()
        free = self.config.max_batch_size - len(self._active)
        chosen: list[Sequence] = []
        width = 0
        while self._waiting and len(chosen) < free:
            seq = self._waiting[0]
            if seq.cancelled or seq.done:
                self._waiting.popleft()
                continue
            if seq.deadline is not None and seq.deadline <= now:
                self._waiting.popleft()
                seq.fail(TimeoutError("deadline passed while waiting; nothing was generated"))
                continue
            new_width = max(width, len(seq.prompt_ids))
            if chosen and new_width * (len(chosen) + 1) > self.config.max_prefill_tokens:
                break
            self._waiting.popleft()
            chosen.append(seq)
            width = new_width
        return chosen

    async def _prefill(self, seqs: list[Sequence]) -> None:
        assert self._executor is not None
        loop = asyncio.get_running_loop()
        try:
            logits, cache = await loop.run_in_executor(
                self._executor, self._runner.prefill, [s.prompt_ids for s in seqs])
        except Exception as exc:
            logger.exception("prefill of %d prompts failed on %s", len(seqs), self._label)
            for seq in seqs:
                seq.fail(RuntimeError(f"prefill failed: {exc}"))
            return
        keep = []
        for row, seq in enumerate(seqs):
            if seq.cancelled:
                seq.finish_reason = FINISH_CANCELLED
                continue
            self._advance(seq, logits[row])
            if not seq.done:
                keep.append(row)
        if keep:
            self._cache = BatchCache.concat(self._cache, cache.select(keep))
            self._active.extend(seqs[row] for row in keep)

    async def _step(self) -> None:
        assert self._executor is not None and self._cache is not None
        loop = asyncio.get_running_loop()
        tokens = np.asarray([seq.generated[-1] for seq in self._active], dtype=np.int64)
        try:
            logits, cache = await loop.run_in_executor(self._executor, self._runner.step, self._cache, tokens)
        except Exception as exc:
            logger.exception("decode step of %d sequences failed on %s", len(self._active), self._label)
            for seq in self._active:
                seq.fail(RuntimeError(f"decode step failed: {exc}"))
            self._active.clear()
            self._cache = None
            return
        self._cache = cache
        if self._metrics is not None:
            self._metrics.batch_size.labels(model=self._label).observe(len(self._active))
        for row, seq in enumerate(self._active):
            if not seq.cancelled and not seq.done:
                self._advance(seq, logits[row])

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
            seq.queue.put_nowait(StreamChunk(text=text, tokens=[generated]))

    # ------------------------------------------------------------------ metrics

    def _record_token(self, seq: Sequence) -> None:
        now = time.monotonic()
        m = self._metrics
        if m is not None:
            m.generated_tokens.labels(model=self._label).inc()
            if seq.first_token_at is None:
                m.time_to_first_token.labels(model=self._label).observe(now - seq.arrival)
            else:
                m.inter_token_latency.labels(model=self._label).observe(now - (seq.last_token_at or now))
        if seq.first_token_at is None:
            seq.first_token_at = now
        seq.last_token_at = now

    def _record_gauges(self) -> None:
        if self._metrics is not None:
            self._metrics.active_sequences.labels(model=self._label).set(len(self._active))
            self._metrics.queued_requests.labels(model=self._label).set(len(self._waiting))

    def _check_logits(self, logits: np.ndarray, batch: int, what: str) -> None:
        if logits.ndim != 2 or logits.shape[0] != batch or logits.shape[1] < self.spec.vocab_size:
            raise RuntimeError(f"warmup {what}: logits have shape {logits.shape}, expected "
                               f"[{batch}, >= vocab_size {self.spec.vocab_size}]")
        if not np.isfinite(logits).all():
            raise RuntimeError(f"warmup {what}: logits are not finite")
