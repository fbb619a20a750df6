"""Settings -> what each model version runs with (RuntimeConfig, server/model.py): the sessions', the batchers',
the generation engines' and admission's share of the settings (server/runtime/settings.py says what each limit
counts)."""
from __future__ import annotations

import logging
import os

from server.admission import AdmissionLimits
from server.encoders.batching import BatchConfig
from server.generation import GenerationConfig
from server.model import RuntimeConfig
from server.runtime.settings import ServerSettings
from server.sessions import SessionConfig, resolve_providers

log = logging.getLogger(__name__)


def runtime_config(settings: ServerSettings) -> RuntimeConfig:
    """Settings -> what each model version runs with (see server/runtime/settings.py for what each limit counts)."""
    threads = intra_op_threads(settings)
    return RuntimeConfig(
        session=SessionConfig(providers=resolve_providers(settings.providers),
                              intra_op_threads=threads,
                              inter_op_threads=settings.inter_op_threads, variant=settings.variant,
                              spinning=settings.intra_op_spinning),
        batch=BatchConfig(max_batch_size=settings.max_batch_size,
                          max_queue_delay_s=settings.max_queue_delay_ms / 1000.0,
                          max_queued_requests=settings.max_queued_requests,
                          instances=settings.encoder_instances),
        # max_queued_requests bounds both queues of a model: an encoder's batcher queue, and here the
        # generation requests admitted but not yet prefilled (documented on the setting).
        generation=GenerationConfig(max_batch_size=settings.max_sequences,
                                    max_waiting=settings.max_queued_requests,
                                    max_tokens_in_flight=settings.max_tokens_in_flight,
                                    prefill_chunk_tokens=settings.prefill_chunk_tokens,
                                    max_prefill_tokens=settings.max_prefill_tokens,
                                    stream_interval=settings.stream_interval,
                                    decode_steps=settings.decode_steps, decode_run_ms=settings.decode_run_ms,
                                    prefix_caching=settings.prefix_caching == "on",
                                    overlap_step_ms=overlap_step_ms(settings, threads),
                                    max_model_len=settings.max_model_len),
        admission=AdmissionLimits(max_rows_per_request=settings.max_rows_per_request,
                                  max_pieces_per_request=settings.max_pieces_per_request,
                                  max_fill_mask_candidates=settings.max_fill_mask_candidates,
                                  max_response_bytes=settings.max_message_bytes,
                                  max_request_memory_bytes=settings.max_request_memory_mb << 20),
        generation_instances=settings.generation_instances)


def intra_op_threads(settings: ServerSettings) -> int:
    """--intra-op-threads; left at 0 (onnxruntime's default: a thread per core) with several generation engines,
    the cores shared out between them, since each engine's sessions would otherwise take every core."""
    threads, instances = settings.intra_op_threads, settings.generation_instances
    cores = len(os.sched_getaffinity(0))
    if instances > 1 and not threads:
        threads = max(1, cores // instances)
        log.info("%d generation engines a model: %d onnxruntime threads each (--intra-op-threads)", instances, threads)
    if instances > 1 and instances * threads > cores:
        log.warning("%d generation engines x %d onnxruntime threads exceed the %d cores: they will take turns",
                    instances, threads, cores)
    return threads


def leaves_a_core(engine_threads: int, cores: int | None = None) -> bool:
    """Whether onnxruntime threads numbering `engine_threads` in all (every engine's, in every process that shares
    these cores) leave the event loop a core: the condition of steps overlapping its work (overlap_step_ms). With
    every core computing the step, the loop's work only takes turns with the step's threads, and a first token's
    message waits for them (bench/FINDINGS.md)."""
    return engine_threads < (cores or len(os.sched_getaffinity(0)))


def overlap_step_ms(settings: ServerSettings, threads: int, cores: int | None = None) -> float:
    """--overlap-step-ms where the engines' onnxruntime threads (0: one a core) x --generation-instances leave the
    event loop a core (`leaves_a_core`), else 0."""
    cores = cores or len(os.sched_getaffinity(0))
    if leaves_a_core((threads or cores) * settings.generation_instances, cores):
        return settings.overlap_step_ms
    if settings.overlap_step_ms:
        log.info("onnxruntime's threads take all %d cores: no decode step overlaps the event loop's work "
                 "(--overlap-step-ms needs fewer --intra-op-threads)", cores)
    return 0.0


__all__ = ["intra_op_threads", "leaves_a_core", "overlap_step_ms", "runtime_config"]
