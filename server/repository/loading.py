"""Building a served model from its package directory (runs in a worker thread: everything slow)."""
from __future__ import annotations

import logging
from pathlib import Path

import onnxruntime as ort

from server.generation.decoder_model import DecoderModel
from server.encoders.encoder import EncoderModel
from server.runtime.metrics import Metrics
from server.model import Loaded, RuntimeConfig, ServedModel
from server.repository.package import Package, PackageError, read_package, verify_files
from server.repository.probe import probe_mismatch
from server.repository.served_files import refused_variants, served_files
from server.generation.seq2seq_model import Seq2SeqModel
from server.sessions import SessionRunner, choose_variant, create_session
from server.runtime.stats import ModelStats

log = logging.getLogger(__name__)


def build_model(path: Path, name: str, version: int, runtime: RuntimeConfig, metrics: Metrics,
                stats: ModelStats) -> ServedModel:
    """Runs in a worker thread: everything slow (hashing, session creation, warm-up). PackageError on failure."""
    package = read_package(path, name, version)
    manifest = package.manifest
    variant, session, notes = _checked_variant(package, runtime)
    parts = Loaded(package=package, variant=variant, runner=SessionRunner(session), runtime=runtime,
                   metrics=metrics, stats=stats, notes=tuple(notes))
    try:
        model: ServedModel = (Seq2SeqModel(parts) if manifest.encoder_decoder is not None
                              else DecoderModel(parts) if package.task == "generate" else EncoderModel(parts))
        model.warm_up()
    except PackageError:
        raise
    except Exception as exc:  # tokenizer parse errors, DecoderSpec ValueErrors, graph failures
        raise PackageError(f"warm-up failed: {exc}") from None
    return model


def _checked_variant(package: Package, runtime: RuntimeConfig) -> tuple[str, ort.InferenceSession, list[str]]:
    """The variant to serve, its session, and why better ones were passed over: each candidate's files verified,
    then its probe run (repository/probe.py). One that answers otherwise on this CPU is refused like a variant whose
    gate failed: the next one is tried; a configured one is a PackageError naming why."""
    refused, notes = refused_variants(package), []
    while True:
        variant = choose_variant(package.manifest, runtime.session.variant, runtime.session.device, refused)
        verify_files(package, served_files(package, variant))
        session = create_session(package, variant, runtime.session)
        why = probe_mismatch(package, variant, session,
                             lambda graph: create_session(package, variant, runtime.session, graph))
        if why is None:
            return variant, session, notes
        if runtime.session.variant == variant:
            raise PackageError(f"--variant {variant}: {why}; it is not served")
        log.warning("model %s version %d: variant %s not served: %s", package.name, package.version, variant, why)
        refused[variant] = why
        notes.append(f"variant {variant} not served: {why}")
