"""The generation engine: continuous batching over an in-place-cache decoder (numpy + onnxruntime only).

A request's path, in four parts with one job each:
  - input processing (inputs.py): prompt text or ids -> checked ids that fit the context, on arrival;
  - the core loop (this module): each iteration the scheduler (scheduler.py, pure Python) plans which slots
    decode a token and which prompt chunks go in; the executor (executor.py) runs the plan in the engine's one
    worker thread — the onnxruntime calls over the slot cache on the session's device (slot_runner.py,
    device_cache.py), then the next token of every row that gets one, all rows together (sampling.py);
  - output processing (outputs.py): each chosen token -> text, stop checks, a chunk on the request's queue.
The loop is free while the thread computes: consumers take their chunks (and the doors send them) meanwhile.
While nothing waits to be admitted and every running sequence decodes, one iteration may run several decode steps
back to back in the thread (GenerationConfig.decode_steps, within decode_run_ms; executor.py): an arrival or a
leaving consumer sets `_interrupt`, which ends such a run after its current step.

Encoder-decoder packages (model.json `encoder_decoder`; factory.py picks the parts) run through the same loop: the
prompt is the source, checked against max_source_length on arrival (source.py); when the scheduler admits the
sequence its source is encoded — in one encoder call with every other source admitted that iteration — and its
cross-attention keys/values copied once into its slot's cross buffer (encoder_step.py, device_cache.py); its
decoder prompt is the start token, which rides the iteration's decode call, and from then on its steps batch with
every other sequence's. Prefix caching does not apply to them (a slot's keys/values depend on the source).
Beam search (num_beams > 1, encoder-decoders only; beams.py): a request's k beams hold k slots, admitted together,
and step as rows of the shared decode call; n identical jobs of one request (OpenAI's `n`) are ONE search whose n
best hypotheses answer them. A beam search's answer comes whole, at its end: it is not streamed.

Deadlines are time.monotonic() values: a request whose deadline passes before its prefill raises TimeoutError
from `stream`/`generate` and is never computed; a running one ends with finish_reason "cancelled" and keeps the
text produced so far.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator, Callable

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from modelpkg import Manifest

from .beams import Beam, BeamOptions, BeamSearch
from .device_cache import Device
from .encoder_step import EncodeRow
from .executor import Outcome, Run, SlotExecutor
from .factory import engine_parts
from .outputs import emit_token
from .params import GenerationConfig, GenerationParams
from .results import FINISH_CANCELLED, EngineStoppedError, GenerationResult, OverloadedError, StreamChunk
from .sampling import Choice
from .scheduler import Plan, Scheduler, SchedulerConfig, SeqState, Status
from .sequence import Sequence, to_generated_token
from .slot_runner import DecodeRow, PrefillRow, SlotRunner

if TYPE_CHECKING:
    from server.runtime.metrics import Metrics

logger = logging.getLogger(__name__)

Job = tuple[str | list[int], GenerationParams]   # one sequence of a request: its prompt and parameters
# Characters of text prompts (or ids of token prompts) in one request above which they are tokenized and checked
# in a worker thread: below it that takes well under a millisecond on the event loop.
INLINE_PROMPT_SIZE = 16_384


class GenerationEngine:
    def __init__(self, session: ort.InferenceSession, manifest: Manifest, tokenizer: Tokenizer,
                 config: GenerationConfig | None = None, metrics: "Metrics | None" = None,
                 model_label: str = "model", mixed_session: ort.InferenceSession | None = None,
                 runner: SlotRunner | None = None, *, encoder_session: ort.InferenceSession | None = None,
                 target_tokenizer: Tokenizer | None = None, instance: int = 0) -> None:
        """mixed_session: the package's mixed graph (cache.mixed_graphs: decode rows and a prompt chunk in one
        run); without it they run one after the other. runner: the cache and calls, when not the default (the
        session's own device: bench.gpu_slots compares another placement). An encoder-decoder package (its
        manifest's encoder_decoder block) is served with `session` its decoder graph, `encoder_session` its
        encoder graph, `tokenizer` its source tokenizer and `target_tokenizer` the target's (None: shared).
        ValueError names what does not fit (a concat-layout package is refused with the command that re-exports
        it). instance: which of a model's engines this is (--generation-instances): its worker thread's name."""
        self.session = session
        self.config = cfg = config or GenerationConfig()
        parts = engine_parts(session, manifest, tokenizer, cfg.max_batch_size, mixed_session, runner,
                             encoder_session, target_tokenizer)
        self.spec = parts.spec
        self.source = parts.source     # None: a decoder
        self.inputs = parts.inputs
        self._tokenizer = parts.tokenizer
        self._label = model_label
        self._instance = instance
        self.admitting = 0        # requests inside admit() (their prompts tokenized): load not yet in the queues
        self._metrics = metrics
        # Labelled children looked up once: labels() locks and builds a key per call, and these run per token.
        self._per_model = None if metrics is None else _ModelMetrics(metrics, model_label)
        self._token_times = _TokenTimes()      # an iteration's token timings, recorded at its end
        self._scheduler = Scheduler(SchedulerConfig(num_slots=cfg.max_batch_size,
                                                    chunk_tokens=cfg.prefill_chunk_tokens,
                                                    max_prefill_tokens=cfg.max_prefill_tokens,
                                                    prefix_reuse=cfg.prefix_caching and parts.prefix_reuse,
                                                    slot_length=self.spec.max_length))
        self._runner = parts.runner
        self._executor = SlotExecutor(self._runner)
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._thread: ThreadPoolExecutor | None = None
        # Set when a request arrives or leaves: a run of several decode steps (decode_steps) stops after its step.
        self._interrupt = threading.Event()
        if self._runner.device.kind != Device.of(self._runner.session).kind:
            logger.warning("generation %s: a %s cache beside a CUDA session: onnxruntime's CUDA GroupQueryAttention "
                           "takes fp16 only, so attention runs on the CPU provider and the cache stays in host "
                           "memory; export the package with --variants fp32,fp16 to keep it on the GPU", model_label,
                           np.dtype(self.spec.past_dtype).name)
        logger.info("generation %s: %d cache slots of %d tokens%s (%.1f MiB of %s on %s), prefill chunk %d tokens, %s",
                    model_label, cfg.max_batch_size, self.spec.max_length,
                    "" if self.source is None else f" + cross buffers of {self.source.max_length} source tokens",
                    self._runner.cache_bytes / 2 ** 20, np.dtype(self.spec.past_dtype).name,
                    self._runner.device.kind, cfg.prefill_chunk_tokens,
                    "encoder-decoder" if self.source is not None else
                    "mixed graph (decode rows and a chunk in one run)" if mixed_session is not None
                    else "no mixed graph")

    # ------------------------------------------------------------------ lifecycle

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def active_sequences(self) -> int:
        """Sequences holding a cache slot (not counting waiting ones)."""
        return len(self._scheduler.running)

    @property
    def waiting_requests(self) -> int:
        return len(self._scheduler.waiting)

    async def start(self) -> None:
        if self.running:
            return
        self._wake = asyncio.Event()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"generate-{self._label}"
                                          + (f"-{self._instance}" if self._instance else ""))
        self._task = asyncio.create_task(self._loop(), name=f"generation-loop-{self._label}")
        logger.info("generation engine %s started (max_batch_size=%d)", self._label, self.config.max_batch_size)

    async def stop(self) -> None:
        """Stop the loop; every waiting or running request ends with finish_reason "cancelled"."""
        task, self._task = self._task, None
        self._interrupt.set()     # a run of several decode steps ends after the one in progress
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        for seq in self._sequences():
            seq.finish(FINISH_CANCELLED)
        self._clear()
        if self._thread is not None:
            # A step still running in the thread finishes on its own; do not block the event loop on it.
            self._thread.shutdown(wait=False, cancel_futures=True)
            self._thread = None
        if self._per_model is not None:
            self._per_model.gauges.forget(self)
        logger.info("generation engine %s stopped", self._label)

    def warmup(self) -> None:
        """Every kind of run serving will make, at full width (so onnxruntime sizes its buffers now, not during
        the first requests): a two-row first prompt, a continuation chunk, a decode step over every slot with
        a hole, and the mixed graph's decode + chunk. Raises on any failure; the slots' contents do not matter
        afterwards (every position is written before it is read)."""
        start = next((t for t in (self.spec.bos_id, self.spec.eos_id) if t is not None), 0)
        if self.source is not None:
            start = self.source.start_id
            self._warm_source()
        r, n = self._runner, self._runner.num_slots
        chunk = max(1, min(self.config.prefill_chunk_tokens, self.spec.max_length // 2))
        pair = [PrefillRow(0, [start] * chunk, 0)] + ([PrefillRow(1, [start], 0)] if n > 1 else [])
        self._check_logits(r.prefill(pair, first_prompt=True)[:, 0], len(pair), "prefill")
        more = r.prefill([PrefillRow(0, [start] * 2, chunk)], first_prompt=False)
        self._check_logits(more[:, -1], 1, "prefill chunk")
        rows = [DecodeRow(slot, start, 1) for slot in range(n) if slot != 1 or n == 1]
        self._check_logits(r.decode(rows, {1: 1}), len(rows), "step")   # slot 1 sits in the range, idle
        if r.mixed_session is not None:
            dec, pre = r.decode_and_prefill(rows, {}, [PrefillRow(1 if n > 1 else 0, [start] * chunk, 0)], True)
            self._check_logits(dec, len(rows), "mixed step")
            self._check_logits(pre[:, -1], 1, "mixed chunk")
        # The edges requests may reach: the vocabulary's last id (the embedding's last row) and the context's last
        # position (the position table's last row, attention over the whole slot). A model.json claiming more than
        # the graph holds fails here, at load, instead of inside every request that gets there.
        top, last = self.spec.vocab_size - 1, self.spec.max_length - 1
        vocab, length = (("vocab_size", "max_length") if self.source is None
                         else ("encoder_decoder.target_vocab_size", "encoder_decoder.max_target_length"))
        self._edge(lambda: r.decode([DecodeRow(0, top, 1)], {}), f"model.json {vocab} {top + 1}: token id {top}")
        self._edge(lambda: r.decode([DecodeRow(0, start, last)], {}),
                   f"model.json {length} {last + 1}: position {last}")

    def _warm_source(self) -> None:
        """An encoder-decoder's source side: the encoder at the source vocabulary's last id and at
        max_source_length (two rows of one call, one padded), each written into a slot and read by a decode step."""
        r, source = self._runner, self.source
        assert source is not None and hasattr(r, "encode")
        top, longest = source.vocab_size - 1, source.max_length
        pair = min(2, r.num_slots)

        def run() -> np.ndarray:
            r.encode([EncodeRow([source.pad_id] * longest, (0,)), EncodeRow([top], (pair - 1,))])
            return r.decode([DecodeRow(slot, source.start_id, 0) for slot in range(pair)], {})

        self._edge(run, f"model.json encoder_decoder.source_vocab_size {top + 1} / max_source_length {longest}: "
                        f"source token id {top} and a source of {longest} tokens", pair)
        r.reset_cross()                    # type: ignore[attr-defined]   (the warm-up grew it to max_source_length)
        cost = r.encoder.calibrate()      # type: ignore[attr-defined]
        if cost is not None:
            logger.info("%s encoder: a call costs %.2f ms and a padded source token %.1f us (sources split by "
                        "length where that costs less)", self._label, cost.call * 1e3, cost.token * 1e6)

    def _edge(self, call: Callable[[], np.ndarray], what: str, rows: int = 1) -> None:
        try:
            logits = call()
        except Exception as exc:  # onnxruntime's own exception types
            raise ValueError(f"{what} fails in the graph: {' '.join(str(exc).split())}") from None
        self._check_logits(logits, rows, what)

    # ------------------------------------------------------------------ requests

    async def stream(self, prompt: str | list[int], params: GenerationParams,
                     deadline: float | None = None) -> AsyncIterator[StreamChunk]:
        """Chunks as tokens are produced; the last one has final=True. Closing it early cancels the request.

        Raises ValueError (bad prompt/parameters, naming the field), OverloadedError, TimeoutError,
        EngineStoppedError, or RuntimeError when the graph fails.
        """
        _refuse_streamed_beams([(prompt, params)])
        [seq] = await self.admit([(prompt, params)], deadline)
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
        [seq] = await self.admit([(prompt, params)], deadline)
        seq.whole = True
        return await self._collect(seq)

    async def generate_many(self, jobs: list[Job], deadline: float | None = None,
                            field: str = "prompt") -> list[GenerationResult]:
        """Every completion of one request (prompts x n), admitted together or not at all (`admit`). When one
        fails, or the caller goes away, every other one is cancelled: nothing is generated for nobody."""
        seqs = await self.admit(jobs, deadline, field)
        for seq in seqs:
            seq.whole = True
        if len(seqs) == 1:
            return [await self._collect(seqs[0])]
        tasks = [asyncio.ensure_future(self._collect(seq)) for seq in seqs]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()     # each one's _collect abandons its sequence
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def stream_many(self, jobs: list[Job], deadline: float | None = None,
                          field: str = "prompt") -> list["SequenceStream"]:
        """One chunk stream per job of one request, admitted together or not at all (`admit`); closing a
        stream cancels its sequence."""
        _refuse_streamed_beams(jobs)
        return [SequenceStream(self, seq) for seq in await self.admit(jobs, deadline, field)]

    async def admit(self, jobs: list[Job], deadline: float | None = None, field: str = "prompt") -> list[Sequence]:
        """A request's sequences (one per job) admitted together, or none of them: a request is refused before
        any of its sequences starts, never after some have (their tokens would be generated for nobody).

        What can never fit, whatever the load, is ValueError naming `field` (more sequences than the queue plus
        the running batch, more tokens than the whole budget); what could fit later is OverloadedError. The count
        is checked before any prompt is tokenized, and long prompts are tokenized off the event loop. A beam
        search counts its beams (each holds a slot)."""
        if not self.running:
            raise EngineStoppedError(f"generation engine {self._label} is not running")
        cfg = self.config
        if not jobs:
            raise ValueError(f"{field}: at least one prompt is required")
        jobs = [(prompt, self.inputs.fit(params)) for prompt, params in jobs]
        groups = self._groups(jobs)
        slots = sum(width for _, width in groups)
        most = cfg.max_waiting + cfg.max_batch_size
        if slots > most:
            raise ValueError(f"{field}: {slots} sequences in one request exceed the {most} this engine can ever "
                             f"hold at once (max_queued_requests {cfg.max_waiting} waiting + max_sequences "
                             f"{cfg.max_batch_size} running): this request can never be admitted; send fewer "
                             "prompts (or a lower n or num_beams) per request")
        self.admitting += 1
        try:
            prompts = await self._encode(jobs)
        finally:
            self.admitting -= 1
        if not self.running:     # stopped while the prompts were tokenized
            raise EngineStoppedError(f"generation engine {self._label} is not running")
        if deadline is not None and deadline <= time.monotonic():
            raise TimeoutError("deadline passed before generation started")
        # An encoder-decoder's prompts are sources: each sequence also holds its decoder's start token.
        extra = 0 if self.source is None else 1
        need = sum((len(prompts[members[0]]) + extra + jobs[members[0]][1].max_new_tokens) * width
                   for members, width in groups)
        if need > cfg.max_tokens_in_flight:   # would be refused whatever the load: not worth a retry
            if len(jobs) == 1:
                raise ValueError(f"parameters.max_new_tokens: prompt {len(prompts[0])} tokens + max_new_tokens "
                                 f"{jobs[0][1].max_new_tokens} = {need} exceed max_tokens_in_flight "
                                 f"{cfg.max_tokens_in_flight} (this request can never be admitted; lower "
                                 "max_new_tokens or shorten the prompt)")
            raise ValueError(f"{field}: {len(jobs)} sequences need {need} tokens (prompt + max_new_tokens each), "
                             f"more than max_tokens_in_flight {cfg.max_tokens_in_flight} (this request can never "
                             "be admitted; send fewer prompts per request or lower max_new_tokens)")
        waiting = self.waiting_requests
        room = cfg.max_waiting - waiting + max(0, cfg.max_batch_size - len(self._scheduler.running))
        if slots > room:
            needs = "" if slots == 1 else f"; this request has {slots} sequences and there is room for {room}"
            raise OverloadedError(f"generation queue of {self._label} is full ({waiting} waiting, max_queued_requests "
                                  f"{cfg.max_waiting}{needs}); retry later")
        in_flight = self._scheduler.reserved
        if in_flight + need > cfg.max_tokens_in_flight:
            raise OverloadedError(f"generation of {self._label} is at capacity: {in_flight} tokens in flight, "
                                  f"this request needs {need}, the limit is {cfg.max_tokens_in_flight}")
        seqs: list[Sequence | None] = [None] * len(jobs)
        for members, width in groups:
            created = [self._sequence(prompts[i], jobs[i][1], deadline) for i in members]
            for i, seq in zip(members, created):
                seqs[i] = seq
            if width == 1 and jobs[members[0]][1].num_beams == 1:
                self._scheduler.add(created[0].state)   # type: ignore[arg-type]
            else:
                self._add_search(created)
        self._record_gauges()
        self._kick()
        return seqs   # type: ignore[return-value]

    def _sequence(self, ids: list[int], params: GenerationParams, deadline: float | None) -> Sequence:
        """One job's sequence (a decoder's prompt, or an encoder-decoder's source) and its scheduler state."""
        if self.source is None:
            seq = Sequence.create(ids, params, self._tokenizer, self.spec.vocab_size, deadline, self.spec.eos_id,
                                  stream_interval=self.config.stream_interval)
            # A request scoring its prompt needs the logits at every prompt position, so none may come from a
            # copied prefix: its state does not track tokens (no reuse for it, nothing remembered of its slot).
            seq.state = (SeqState.of(ids, owner=seq) if params.prompt_logprobs is None
                         else SeqState(len(ids), owner=seq))
            seq.state.reserve = seq.budget
            return seq
        prompt = [self.source.start_id]
        seq = Sequence.create(prompt, params, self._tokenizer, self.spec.vocab_size, deadline, self.spec.eos_id,
                              source_ids=ids, forced=self.source.forced(params.max_new_tokens),
                              stream_interval=self.config.stream_interval)
        # Its keys/values depend on its source: no tokens tracked, nothing reused or remembered of its slot.
        seq.state = SeqState(len(prompt), owner=seq, source=len(ids), reserve=seq.budget)
        return seq

    def _add_search(self, requests: list[Sequence]) -> None:
        """One beam search answering `requests` (identical jobs): its beams wait as one gang of states."""
        params = requests[0].params
        assert self.source is not None
        search = BeamSearch(requests, BeamOptions(num_beams=params.num_beams, length_penalty=params.length_penalty,
                                                  early_stopping=params.early_stopping,
                                                  max_new_tokens=params.max_new_tokens,
                                                  eos_id=None if params.ignore_eos else self.spec.eos_id,
                                                  forced=self.source.forced(params.max_new_tokens)),
                            self.spec.vocab_size, self._tokenizer)
        for request in requests:
            request.search, request.state = search, None
        source = len(requests[0].source_ids or ())
        for beam in search.beams:
            first = beam.index == 0
            beam.state = SeqState(len(search.prompt_ids), owner=beam, source=source if first else 0,
                                  gang=params.num_beams if first else 1, reserve=beam.budget)
            self._scheduler.add(beam.state)

    def _groups(self, jobs: list[Job]) -> list[tuple[list[int], int]]:
        """The request's jobs as (job indices, slots): one each, except beam searches — consecutive jobs with
        num_beams > 1 that differ only in beam_rank (OpenAI's n: ranks 0..n-1; seeds aside) are one search of
        num_beams slots answering them all. ValueError naming parameters.num_beams where beams cannot be served."""
        groups: list[tuple[list[int], int]] = []
        for i, (prompt, params) in enumerate(jobs):
            k = params.num_beams
            if k == 1:
                groups.append(([i], 1))
                continue
            if self.source is None:
                raise ValueError(f"parameters.num_beams: beam search is served for encoder-decoder models; "
                                 f"{self._label} is a decoder (num_beams must be 1), got {k}")
            if k > self.config.max_batch_size:
                raise ValueError(f"parameters.num_beams: {k} beams need {k} cache slots, this engine has "
                                 f"max_sequences {self.config.max_batch_size}")
            if groups and groups[-1][1] > 1:
                first_prompt, first_params = jobs[groups[-1][0][0]]
                ranks = {jobs[j][1].beam_rank for j in groups[-1][0]}
                if prompt == first_prompt and _same_search(params, first_params) and params.beam_rank not in ranks:
                    groups[-1][0].append(i)
                    continue
            groups.append(([i], k))
        return groups

    async def _encode(self, jobs: list[Job]) -> list[list[int]]:
        """Each job's prompt ids (checked); a request with much text to tokenize (or many ids to check) is
        processed in a worker thread (tokenizers' encode_batch releases the GIL), not on the event loop."""
        size = sum(len(prompt) for prompt, _ in jobs)
        if size <= INLINE_PROMPT_SIZE:
            return self.inputs.encode_many(jobs, batched=False)
        return await asyncio.get_running_loop().run_in_executor(None, self.inputs.encode_many, jobs)

    async def _collect(self, seq: Sequence) -> GenerationResult:
        """Every chunk of an admitted sequence, as one result; cancelled (or failed) early, it is abandoned."""
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
        return self.inputs.encode(prompt, params)

    def prompt_text(self, token_ids: list[int]) -> str:
        """The text of an admitted token-id prompt (an encoder-decoder's: source ids, by the source tokenizer)."""
        if self.source is None:
            return self.inputs.detokenize(token_ids)
        return self.inputs.source_text(token_ids)   # type: ignore[union-attr]

    def tokenize(self, text: str, truncate: bool = False) -> list[int]:
        return self.inputs.tokenize(text, truncate)

    def detokenize(self, token_ids: list[int]) -> str:
        return self.inputs.detokenize(token_ids)

    def tokenize_batched(self, text: str) -> list[int]:
        """tokenize, through tokenizers' batch call, which releases the GIL (for a worker thread)."""
        return self.inputs.tokenize(text, batched=True)

    def detokenize_batched(self, token_ids: list[int]) -> str:
        """detokenize, through tokenizers' batch call, which releases the GIL (for a worker thread)."""
        return self.inputs.detokenize(token_ids, batched=True)

    @staticmethod
    async def _next_chunk(seq: Sequence) -> StreamChunk:
        return await seq.next_chunk()

    def _abandon(self, seq: Sequence) -> None:
        """The consumer went away: a waiting request leaves now, a running one at the next iteration."""
        seq.cancelled = True
        if seq.search is not None:     # a beam search stops when every request it answers went away
            if seq.search.cancelled and all(s.status is Status.WAITING for s in seq.search.states):
                for state in seq.search.states:
                    self._scheduler.finish(state)
                for request in seq.search.requests:
                    request.finish_reason = request.finish_reason or FINISH_CANCELLED
        elif seq.state is not None and seq.state.status is Status.WAITING:
            self._scheduler.finish(seq.state)
            seq.finish_reason = FINISH_CANCELLED
        self._record_gauges()
        self._kick()

    def _kick(self) -> None:
        self._interrupt.set()
        if self._wake is not None:
            self._wake.set()

    def _sequences(self) -> list[Sequence]:
        """Every waiting or running request."""
        return [s.owner for s in (*self._scheduler.waiting, *self._scheduler.running)]

    def _clear(self) -> None:
        for state in (*self._scheduler.waiting, *self._scheduler.running):
            self._scheduler.finish(state)

    # ------------------------------------------------------------------ the loop

    async def _loop(self) -> None:
        if self._wake is None:
            raise RuntimeError("generation loop started without start()")
        while True:
            ran = firsts = False
            try:
                self._retire()
                if not (self._scheduler.waiting or self._scheduler.running):
                    self._record_gauges()  # the last retire must show up before idling
                    self._runner.idle()     # nothing runs now: the runner may tidy its buffers
                    self._wake.clear()
                    await self._wake.wait()
                    await self._settle_arrivals()
                    continue
                ran, firsts = await self._iterate()
            except asyncio.CancelledError:
                raise
            except Exception as exc:   # a bug here must not leave consumers waiting forever
                logger.exception("generation loop of %s failed; failing its requests", self._label)
                for seq in self._sequences():
                    seq.fail(RuntimeError(f"generation failed: {exc}"))
                self._clear()
            self._record_gauges()
            # No yield between steps: consumers take their chunks (and the doors send them) while the NEXT step
            # computes, since the loop is free while it awaits the worker thread. Only an iteration that ran
            # nothing yields here, so the loop never spins without letting others run; and one that gave some
            # sequence its first token, so the doors send it before the next run's threads take both cores
            # (first token 32 -> 27 ms p50 served, w4 124M Llama, 2 cores, bench/FINDINGS.md).
            if not ran or firsts:
                await asyncio.sleep(0)

    async def _iterate(self) -> tuple[bool, bool]:
        """One iteration: plan, run the plan in the worker thread, apply the outcome. Whether it ran, and whether
        a prompt was completed (a sequence got its first token)."""
        plan = self._scheduler.plan()
        if plan.empty:
            return False, False
        self._interrupt.clear()
        work = self._executor.prepare(plan, self._scheduler, self._run(plan))
        if self._thread is None:
            raise EngineStoppedError(f"generation engine {self._label} is not running")
        outcome = await asyncio.get_running_loop().run_in_executor(self._thread, self._executor.run, work)
        self._apply(outcome)
        self._retire()     # a sequence that just finished gives its slot back before anyone looks
        self._record_plan(plan, 1 + len(outcome.more))
        return True, any(w.chunk.completes_prompt for w in outcome.written)

    def _run(self, plan: Plan) -> Run | None:
        """More decode steps back to back after this iteration's first: for a plan of decode rows alone while no
        request waits, no prompt is part-way in (they would wait the whole run) and no beam search runs."""
        cfg = self.config
        if cfg.decode_steps == 1 or plan.prefill or plan.tails or plan.encode or plan.copies or self._scheduler.waiting:
            return None
        if any(s.status is not Status.DECODING or isinstance(s.owner, Beam) for s in self._scheduler.running):
            return None
        return Run(cfg.decode_steps, cfg.decode_run_ms / 1000, self._interrupt, self.spec.eos_id, self.spec.max_length)

    def _apply(self, outcome: Outcome) -> None:
        self._token_times.now = time.monotonic()    # the instant this iteration's tokens reach their sequences
        try:
            self._apply_outcome(outcome)
        finally:
            self._token_times.record(self._per_model)

    def _apply_outcome(self, outcome: Outcome) -> None:
        for states, what, exc in outcome.failed:
            logger.error("%s on %s for %d sequences: %s", what, self._label, len(states), exc)
            for state in states:
                state.owner.fail(RuntimeError(f"{what}: {exc}"))
                self._scheduler.finish(state, reusable=False)
        for state, choice in outcome.decoded:
            self._scheduler.decoded(state, state.owner.generated[-1])
            self._take(state.owner, choice)
        for step in outcome.more:
            for state, choice in step:
                seq = state.owner
                if seq.done or seq.cancelled:   # ended by a stop string meanwhile: its later tokens are dropped
                    continue
                self._scheduler.decoded(state, seq.generated[-1])
                self._take(seq, choice)
        for w in outcome.written:
            self._scheduler.prefilled(w.chunk)
            seq = w.chunk.seq.owner
            if seq.cancelled or seq.done:
                continue
            if seq.prompt_tokens is not None:
                seq.prompt_tokens.extend(to_generated_token(c, self._tokenizer) for c in w.prompt_scores)
            if w.chunk.completes_prompt:      # the prompt is in: its last position's logits gave the first token
                self._take(seq, w.first_token)
        for search in outcome.beams:
            for request in search.requests:
                if not (request.done or request.cancelled):
                    self._record_token(request)
            if search.stopped:
                search.finish()

    def _take(self, seq: Sequence, choice: Choice | None) -> None:
        if choice is None or seq.cancelled or seq.done:
            return
        self._record_token(seq)
        emit_token(seq, choice, self._tokenizer, self.spec.eos_id)

    def _retire(self) -> None:
        """Drop sequences that are done, cancelled, or past their deadline; their slots are free again."""
        now = time.monotonic()
        for state in list(self._scheduler.waiting):
            seq = state.owner
            if seq.cancelled or seq.done:
                self._scheduler.finish(state)
            elif _deadline_passed(seq, now):
                self._scheduler.finish(state)
                seq.fail(TimeoutError("deadline passed while waiting; nothing was generated"))
        for state in list(self._scheduler.running):
            seq = state.owner
            if seq.cancelled and not seq.done:
                seq.finish_reason = FINISH_CANCELLED    # nobody listens: no chunk
            elif _deadline_passed(seq, now):
                seq.finish(FINISH_CANCELLED)
            if seq.done:
                self._scheduler.finish(state)

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

    # ------------------------------------------------------------------ metrics

    def _record_token(self, seq: Sequence) -> None:
        times, now = self._token_times, self._token_times.now
        if seq.first_token_at is None:
            seq.first_token_at = now
            times.firsts.append(now - seq.arrival)
        else:
            times.gaps.append(now - (seq.last_token_at or now))
        seq.last_token_at = now

    def _record_plan(self, plan: Plan, steps: int = 1) -> None:
        m = self._per_model
        if m is None:
            return
        for _ in range(steps if plan.decode else 0):
            m.batch_size.observe(len(plan.decode))
        if plan.reused_tokens:
            m.prefix_reused_tokens.inc(plan.reused_tokens)
        chunks = sum(len(call.chunks) for call in plan.prefill) + len(plan.tails)
        if chunks:
            m.prefill_chunks.inc(chunks)
            m.prefill_tokens.inc(plan.prefill_tokens)

    def _record_gauges(self) -> None:
        m = self._per_model
        if m is not None:
            s = self._scheduler
            m.gauges.report(self, self.active_sequences, self.waiting_requests, s.reserved, s.occupied_slots,
                            s.config.num_slots)

    def _check_logits(self, logits: np.ndarray, batch: int, what: str) -> None:
        if logits.ndim != 2 or logits.shape[0] != batch or logits.shape[1] < self.spec.vocab_size:
            raise RuntimeError(f"warmup {what}: logits have shape {logits.shape}, expected "
                               f"[{batch}, >= vocab_size {self.spec.vocab_size}]")
        if not np.isfinite(logits).all():
            raise RuntimeError(f"warmup {what}: logits are not finite")


class SequenceStream:
    """The chunks of one admitted sequence (`stream_many`): an async iterator whose aclose() cancels the
    sequence, whether or not it was ever iterated (an async generator's cleanup would not run then)."""

    def __init__(self, engine: GenerationEngine, seq: Sequence) -> None:
        self._engine, self._seq, self._ended = engine, seq, False

    def __aiter__(self) -> "SequenceStream":
        return self

    async def __anext__(self) -> StreamChunk:
        if self._ended:
            raise StopAsyncIteration
        try:
            chunk = await self._engine._next_chunk(self._seq)
        except BaseException:
            await self.aclose()
            raise
        if chunk.final:
            self._ended = True
        return chunk

    async def aclose(self) -> None:
        self._ended = True
        if not self._seq.done:
            self._engine._abandon(self._seq)

    def __del__(self) -> None:
        # Dropped unclosed (a response never sent: its client left before the first byte): nobody can read it.
        if not self._ended and not self._seq.done:
            try:
                self._engine._abandon(self._seq)
            except Exception:   # (at interpreter exit the engine may be half torn down: nothing left to free)
                pass


def _refuse_streamed_beams(jobs: list[Job]) -> None:
    for _, params in jobs:
        if params.num_beams > 1:
            raise ValueError(f"parameters.num_beams: a beam search's hypotheses are only known at its end, so it is "
                             f"not streamed; use num_beams 1 to stream, or a non-streaming call, "
                             f"got {params.num_beams}")


def _same_search(a: GenerationParams, b: GenerationParams) -> bool:
    """Two jobs answered by one beam search: the same parameters but the rank answered and the seed (a search
    draws nothing)."""
    return dataclasses.replace(a, seed=None, beam_rank=0) == dataclasses.replace(b, seed=None, beam_rank=0)


def _deadline_passed(seq: Sequence, now: float) -> bool:
    return seq.deadline is not None and seq.deadline <= now


@dataclass
class _TokenTimes:
    """The tokens of one iteration's outcome: their time, each sequence's first-token latency or gap since its last
    token, put into the metrics once per iteration (a step gives every running sequence a token)."""
    now: float = 0.0
    firsts: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)

    def record(self, m: "_ModelMetrics | None") -> None:
        if m is not None and (self.firsts or self.gaps):
            m.generated_tokens.inc(len(self.firsts) + len(self.gaps))
            for seconds in self.firsts:
                m.time_to_first_token.observe(seconds)
            m.inter_token_latency.observe_many(self.gaps)
        self.firsts.clear()
        self.gaps.clear()


class _ModelMetrics:
    """One model's children of the engine's metrics (server/runtime/metrics.py)."""

    def __init__(self, metrics: "Metrics", label: str) -> None:
        self.generated_tokens = metrics.generated_tokens.labels(model=label)
        self.time_to_first_token = metrics.time_to_first_token.labels(model=label)
        self.inter_token_latency = metrics.inter_token_latency.labels(model=label)
        self.gauges = metrics.generation_gauges(label)     # shared by the model's engines: their sums
        # Per step (per token at batch 1): looked up once, since labels() locks and builds a key on every call.
        self.batch_size = metrics.batch_size.labels(model=label)
        self.prefill_chunks = metrics.prefill_chunks.labels(model=label)
        self.prefill_tokens = metrics.prefill_tokens.labels(model=label)
        self.prefix_reused_tokens = metrics.prefix_reused_tokens.labels(model=label)
