"""onnxruntime sessions: providers, variant choice, session options, IOBinding runs and warm-up."""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import onnxruntime as ort
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument as OrtInvalidArgument

from modelpkg import Manifest
from server.protocol.errors import Code, ServingError
from server.repository.package import Package, PackageError
from server.runtime.settings import VARIANT_AUTO

log = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


@dataclass(frozen=True)
class SessionConfig:
    providers: tuple[str, ...]
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    variant: str = VARIANT_AUTO
    spinning: str = "off"    # intra-op threads spin: "on", "off", "auto" = on for decoders only

    @property
    def device(self) -> str:
        return "cuda" if self.providers and self.providers[0] == CUDA else "cpu"


def resolve_providers(requested: list[str]) -> tuple[str, ...]:
    """[] -> CUDA (when this onnxruntime has it) then CPU; otherwise the requested ones, all available."""
    available = ort.get_available_providers()
    if not requested:
        return (CUDA, CPU) if CUDA in available else (CPU,)
    missing = [p for p in requested if p not in available]
    if missing:
        raise ValueError(f"--providers: {missing[0]} is not available (available: {', '.join(available)})")
    return tuple(requested)


def choose_variant(manifest: Manifest, preference: str, device: str, refused: Mapping[str, str] | None = None) -> str:
    """The configured variant if the package has it, else the manifest default for the device (for "cpu" the
    exporter writes the fastest variant that passed its gate, e.g. w4), else fp32. fp16 never runs on CPU.

    `refused`: variant -> why its own parity verdict did not pass (server/repository/served_files.py). Such a
    variant is never chosen: auto passes over it; a configured one is a PackageError naming it and why."""
    refused = refused or {}
    variants = manifest.variants
    if preference in refused and preference in variants:
        raise PackageError(f"--variant {preference}: {refused[preference]} in parity.json; it is not served")
    defaults = manifest.default_variant or {}
    candidates = [] if preference == VARIANT_AUTO else [preference]
    candidates += [defaults.get(device), "fp32", *variants]
    for name in candidates:
        if name in variants and name not in refused and not (name == "fp16" and device == "cpu"):  # fp16: GPU-only
            if preference not in (VARIANT_AUTO, name):
                log.info("variant %s not in package %s; using %s", preference, manifest.name, name)
            return name
    why = "; ".join(f"{name}: {refused[name]}" for name in variants if name in refused)
    raise PackageError(f"model.json: no variant usable on {device} (has {', '.join(variants)})"
                       + (f"; refused by parity.json: {why}" if why else ""))


# On CPU onnxruntime would fuse a residual Add and its LayerNormalization into SkipLayerNormalization, which its CPU
# kernel runs slower than the two ("Residual norms" in export/decoder_graph.py; bench/FINDINGS.md): the exporter
# writes them apart, and this keeps them so (RMSNorm's fused op is fast and is written fused; CUDA keeps every fusion).
DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]


def create_session(package: Package, variant: str, config: SessionConfig, file: str | None = None
                   ) -> ort.InferenceSession:
    """The variant's graph, or `file` of the package (a decoder's mixed graph) with the same options."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Spinning keeps intra-op threads hot: a decoder's back-to-back steps gain on dedicated cores, but on shared
    # cores the spinning threads take the CPU the event loop and other processes need (bench/FINDINGS.md). Off
    # unless asked.
    spin = config.spinning == "on" or (config.spinning == "auto" and package.manifest.task == "generate")
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    if _in_shared_pool(config):
        options.use_per_session_threads = False
    else:
        options.intra_op_num_threads = config.intra_op_threads
        options.inter_op_num_threads = config.inter_op_threads
    path = package.file(file or package.manifest.variant_file(variant))
    try:
        cpu = "CUDAExecutionProvider" not in config.providers
        return ort.InferenceSession(str(path), sess_options=options, providers=list(config.providers),
                                    disabled_optimizers=DISABLED_OPTIMIZERS if cpu else None)
    except Exception as exc:  # onnxruntime raises its own exception types for bad graphs
        raise PackageError(f"onnxruntime cannot load {path.name}: {exc}") from None


_pool_lock = threading.Lock()
_shared_pool = False     # the process has onnxruntime's shared thread pool


def _in_shared_pool(config: SessionConfig) -> bool:
    """Whether a new session runs on the process's one shared (spinning) thread pool.

    It is made when spinning is "on": every graph spins then anyway, and a decoder's plain and mixed graphs,
    run one after the other from one thread, would otherwise each keep a pool whose threads still spin while
    the other graph works (slowing its first runs: bench/FINDINGS.md), so the runner would have to send every call
    through the mixed graph (server/generation/slot_runner.py). onnxruntime makes such a pool once per process
    and then takes no session with a pool of its own, so once it exists every session joins it."""
    global _shared_pool
    with _pool_lock:     # models load in parallel threads
        if not _shared_pool and config.spinning == "on":
            try:
                ort.set_global_thread_pool_sizes(config.intra_op_threads, config.inter_op_threads)
                log.info("one shared onnxruntime thread pool: %d intra-op threads, spinning", config.intra_op_threads)
            except Exception as exc:   # made earlier in this process by someone else: join it all the same
                log.warning("onnxruntime's shared thread pool already exists (%s); joining it", exc)
            _shared_pool = True
        return _shared_pool


class SessionRunner:
    """Runs a session; on CUDA through IOBinding so inputs are copied once and outputs land on the host."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self.session = session
        self.providers = session.get_providers()
        self.use_io_binding = self.providers[0] == CUDA
        self.output_names = [o.name for o in session.get_outputs()]

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        names = outputs or self.output_names
        if not self.use_io_binding:
            return dict(zip(names, self.session.run(names, feeds)))
        binding = self.session.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name in names:
            binding.bind_output(name, "cpu")
        self.session.run_with_iobinding(binding)
        return dict(zip(names, binding.copy_outputs_to_cpu()))


def run_failure(exc: Exception) -> ServingError:
    """A failed session run -> ServingError: inputs onnxruntime refuses are the caller's, the rest INTERNAL."""
    if isinstance(exc, ServingError):
        return exc
    if isinstance(exc, OrtInvalidArgument):
        return ServingError.invalid("inputs", f"onnxruntime rejected them: {exc}")
    return ServingError(Code.INTERNAL, f"inference failed: {exc}")


def warm_up_encoder(runner: SessionRunner, manifest: Manifest, max_batch_size: int) -> None:
    """Runs the encoder graph on a few shapes; PackageError if it fails or answers the wrong shape.

    (Decoders are warmed up by the generation engine, which owns their prefill / step paths.)
    """
    max_length = manifest.max_length
    try:
        for batch, seq in sorted({(1, min(4, max_length)), (2, min(9, max_length)),
                                  (min(max_batch_size, 4), min(16, max_length))}):
            shape = (batch, seq)
            # The inputs the manifest declares (no token_type_ids for RoBERTa / DistilBERT packages).
            out = runner.run({t.name: (np.ones if t.name == "attention_mask" else np.zeros)(shape, np.int64)
                              for t in manifest.inputs})
            _check_encoder_output(out, manifest, batch, seq)
    except PackageError:
        raise
    except Exception as exc:
        raise PackageError(f"warm-up failed: {exc}") from None


def _check_encoder_output(out: dict[str, np.ndarray], manifest: Manifest, batch: int, seq: int) -> None:
    if manifest.task == "embed":
        vectors = out.get("embeddings")
        if vectors is None or vectors.ndim != 2 or vectors.shape[0] != batch:
            raise PackageError("warm-up: an embedding graph answers 'embeddings' [batch, dimension], got "
                               f"{None if vectors is None else list(vectors.shape)}")
        return
    logits = out.get("logits")
    if logits is None:
        raise PackageError("warm-up: the graph has no 'logits' output")
    if manifest.task == "classify":
        expected: tuple[int, ...] = (batch, len(manifest.labels))
    elif manifest.task == "token-classify":
        expected = (batch, seq, len(manifest.labels))
    else:
        expected = (batch, seq, logits.shape[-1])
        vocab = manifest.vocab_size
        if isinstance(vocab, int) and logits.shape[-1] != vocab:
            raise PackageError(f"warm-up: logits have {logits.shape[-1]} columns, vocab_size is {vocab}")
    if logits.shape != expected:
        raise PackageError(f"warm-up: logits shape {list(logits.shape)}, expected {list(expected)}")
