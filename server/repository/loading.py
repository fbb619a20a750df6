"""Building a served model from its package directory (runs in a worker thread: everything slow)."""
from __future__ import annotations

from pathlib import Path

from server.generation.decoder_model import DecoderModel
from server.encoders.encoder import EncoderModel
from server.runtime.metrics import Metrics
from server.model import Loaded, RuntimeConfig, ServedModel
from server.repository.package import PackageError, read_package, verify_files
from server.repository.served_files import refused_variants, served_files
from server.generation.seq2seq_model import Seq2SeqModel
from server.sessions import SessionRunner, choose_variant, create_session
from server.runtime.stats import ModelStats


def build_model(path: Path, name: str, version: int, runtime: RuntimeConfig, metrics: Metrics,
                stats: ModelStats) -> ServedModel:
    """Runs in a worker thread: everything slow (hashing, session creation, warm-up). PackageError on failure."""
    package = read_package(path, name, version)
    manifest = package.manifest
    variant = choose_variant(manifest, runtime.session.variant, runtime.session.device, refused_variants(package))
    verify_files(package, served_files(package, variant))
    session = create_session(package, variant, runtime.session)
    parts = Loaded(package=package, variant=variant, runner=SessionRunner(session), runtime=runtime,
                   metrics=metrics, stats=stats)
    try:
        model: ServedModel = (Seq2SeqModel(parts) if manifest.encoder_decoder is not None
                              else DecoderModel(parts) if package.task == "generate" else EncoderModel(parts))
        model.warm_up()
    except PackageError:
        raise
    except Exception as exc:  # tokenizer parse errors, DecoderSpec ValueErrors, graph failures
        raise PackageError(f"warm-up failed: {exc}") from None
    return model
