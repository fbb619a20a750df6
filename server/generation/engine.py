"""The generation engine: continuous batching over an in-place-cache decoder (numpy + onnxruntime only).

A request's path, in parts with one job each:
  - input processing (inputs.py): prompt text or ids -> checked ids that fit the context, on arrival;
  - admission (admission.py): a request's sequences into the scheduler's queue together or not at all (capacity,
    token budget);
  - the core loop (loop.py): each iteration the scheduler (scheduler.py, pure Python) plans which slots decode a
    token and which prompt chunks go in; the executor (executor.py) runs the plan in the engine's one worker
    thread — the onnxruntime calls over the slot cache on the session's device (slot_runner.py, device_cache.py),
    then every row that gets a next token handed to its decoding strategy (strategies.py: sampling, beams), all of
    a strategy's rows together;
  - output processing (outputs.py): a step's tokens checked for every row at once against the array state
    (slot_state.py: stop tokens, budgets), then each chosen token -> text, stop strings, a chunk on the request's
    queue, read as a stream or a whole result (streams.py).
This module assembles them (with the warm-up, warmup.py, and the metrics, engine_metrics.py) behind the API the
served models call.

Encoder-decoder packages (model.json `encoder_decoder`; factory.py picks the parts) run through the same loop: the
prompt is the source, checked against max_source_length on arrival (source.py); when the scheduler admits the
sequence its source is encoded — in one encoder call with every other source admitted that iteration — and its
cross-attention keys/values copied once into its slot's cross buffer (encoder_step.py, device_cache.py); its
decoder prompt is the start token, which rides the iteration's decode call, and from then on its steps batch with
every other sequence's. Prefix caching does not apply to them (a slot's keys/values depend on the source).
Beam search (num_beams > 1, decoders and encoder-decoders; beams.py): a request's k beams hold k slots, admitted
together; the prompt is prefilled once and copied to the other beams by the first step, and the beams step as rows
of the shared decode call; n identical jobs of one request (OpenAI's `n`) are ONE search whose n best hypotheses
answer them. A beam search's answer comes whole, at its end: it is not streamed.

Deadlines are time.monotonic() values: a request whose deadline passes before its prefill raises TimeoutError
from `stream`/`generate` and is never computed; a running one ends with finish_reason "cancelled" and keeps the
text produced so far.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, AsyncIterator

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from modelpkg import Manifest

from .admission import Admission, Job
from .device_cache import Device
from .engine_metrics import EngineMetrics
from .factory import engine_parts
from .loop import EngineLoop
from .params import GenerationConfig, GenerationParams
from .results import GenerationResult, StreamChunk
from .scheduler import Scheduler, SchedulerConfig
from .sequence import Sequence
from .runner import Runner
from .streams import SequenceStream, collect, collect_all, refuse_streamed_beams, stream_one
from .warmup import warm_up

if TYPE_CHECKING:
    from server.runtime.metrics import Metrics

logger = logging.getLogger(__name__)


class GenerationEngine:
    def __init__(self, session: ort.InferenceSession, manifest: Manifest, tokenizer: Tokenizer,
                 config: GenerationConfig | None = None, metrics: "Metrics | None" = None,
                 model_label: str = "model", mixed_session: ort.InferenceSession | None = None,
                 runner: Runner | None = None, *, encoder_session: ort.InferenceSession | None = None,
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
                             encoder_session, target_tokenizer, cfg.max_model_len)
        self.spec = parts.spec
        self.source = parts.source     # None: a decoder
        self.inputs = parts.inputs
        self._label = model_label
        self._scheduler = Scheduler(SchedulerConfig(num_slots=cfg.max_batch_size,
                                                    chunk_tokens=cfg.prefill_chunk_tokens,
                                                    max_prefill_tokens=cfg.max_prefill_tokens,
                                                    prefix_reuse=cfg.prefix_caching and parts.prefix_reuse,
                                                    slot_length=self.spec.max_length))
        self._runner = parts.runner
        self._metrics = EngineMetrics(metrics, model_label, self._scheduler)
        self._loop = EngineLoop(self._scheduler, parts, cfg, self._metrics, model_label, instance)
        self._admission = Admission(self._scheduler, parts, cfg, model_label, lambda: self.running,
                                    self._queue_changed)
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
    def self_cache_bytes(self) -> tuple[int, int]:
        """(bytes of one slot's self cache: every layer's key and value rows; bytes of the whole self cache, the
        mixed graph's scratch slot included). An encoder-decoder's cross buffers are apart: they grow and shrink
        with the sources served."""
        cache = self._runner.cache
        return cache.slot_bytes * len(cache.values), cache.nbytes

    @property
    def running(self) -> bool:
        return self._loop.running

    @property
    def active_sequences(self) -> int:
        """Sequences holding a cache slot (not counting waiting ones)."""
        return len(self._scheduler.running)

    @property
    def waiting_requests(self) -> int:
        return len(self._scheduler.waiting)

    @property
    def admitting(self) -> int:
        """Requests inside admit() (their prompts tokenized): load not yet in the queues."""
        return self._admission.admitting

    async def start(self) -> None:
        if self.running:
            return
        self._loop.start()
        logger.info("generation engine %s started (max_batch_size=%d)", self._label, self.config.max_batch_size)

    async def stop(self) -> None:
        """Stop the loop; every waiting or running request ends with finish_reason "cancelled"."""
        await self._loop.stop()
        self._metrics.forget_gauges()
        logger.info("generation engine %s stopped", self._label)

    def warmup(self) -> None:
        """Every kind of run serving will make, at full width, and the edges requests may reach (warmup.py).
        Raises on any failure."""
        warm_up(self._runner, self.spec, self.source, self.config.prefill_chunk_tokens, self._label)

    # ------------------------------------------------------------------ requests

    def stream(self, prompt: str | list[int], params: GenerationParams,
               deadline: float | None = None) -> AsyncIterator[StreamChunk]:
        """Chunks as tokens are produced; the last one has final=True. Closing it early cancels the request.

        Raises ValueError (bad prompt/parameters, naming the field), OverloadedError, TimeoutError,
        EngineStoppedError, or RuntimeError when the graph fails.
        """
        return stream_one(self.admit, self._admission.abandon, prompt, params, deadline)

    async def generate(self, prompt: str | list[int], params: GenerationParams,
                       deadline: float | None = None) -> GenerationResult:
        """The whole completion; same errors as `stream`. Cancelling the awaiting task cancels the request."""
        [seq] = await self.admit([(prompt, params)], deadline)
        seq.whole = True
        return await collect(seq, self._admission.abandon)

    async def generate_many(self, jobs: list[Job], deadline: float | None = None,
                            field: str = "prompt") -> list[GenerationResult]:
        """Every completion of one request (prompts x n), admitted together or not at all (`admit`). When one
        fails, or the caller goes away, every other one is cancelled: nothing is generated for nobody."""
        return await collect_all(await self.admit(jobs, deadline, field), self._admission.abandon)

    async def stream_many(self, jobs: list[Job], deadline: float | None = None,
                          field: str = "prompt") -> list[SequenceStream]:
        """One chunk stream per job of one request, admitted together or not at all (`admit`); closing a
        stream cancels its sequence."""
        refuse_streamed_beams(jobs)
        return [SequenceStream(seq, self._admission.abandon) for seq in await self.admit(jobs, deadline, field)]

    async def admit(self, jobs: list[Job], deadline: float | None = None, field: str = "prompt") -> list[Sequence]:
        """A request's sequences (one per job) admitted together, or none of them (admission.py): ValueError
        naming `field` for what can never fit, OverloadedError for what could fit later."""
        return await self._admission.admit(jobs, deadline, field)

    def _queue_changed(self) -> None:
        self._metrics.record_gauges()
        self._loop.kick()

    # ------------------------------------------------------------------ text

    def encode_prompt(self, prompt: str | list[int], params: GenerationParams) -> list[int]:
        return self.inputs.encode(prompt, params)

    def prompt_text(self, token_ids: list[int]) -> str:
        """The text of an admitted token-id prompt (an encoder-decoder's: source ids, by the source tokenizer)."""
        return self.inputs.prompt_text(token_ids)

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
