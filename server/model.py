"""One model version in memory: verified package, onnxruntime session, tokenizer, batcher or generation engine.

Lifecycle: LOADING → (verify, session, warm-up in a worker thread) → SERVING, or NOT_SERVING with the
reason. Retiring it (UNLOADED) stops new requests at once; it is closed when its last request is done.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnxruntime as ort

from server.batching import BatchConfig, DynamicBatcher
from server.generation import GenerationConfig, GenerationEngine
from server.metrics import Metrics
from server.package import Package, PackageError, read_package, verify_files
from server.sessions import SessionConfig, SessionRunner, choose_variant, create_session, warm_up_encoder
from server.signature import TensorSpec, specs_from_manifest
from server.stats import ModelStats
from server.tokenization import TextEncoder
from server.types import ModelState, ModelStatus

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RuntimeConfig:
    """Everything a model version needs from the settings."""

    session: SessionConfig
    batch: BatchConfig
    generation: GenerationConfig


@dataclass
class _Loaded:
    """What the worker thread builds; attached to the ServedModel on the event loop."""

    package: Package
    variant: str
    session: ort.InferenceSession
    runner: SessionRunner
    encoder: TextEncoder | None
    engine: GenerationEngine | None
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]


class ServedModel:
    def __init__(self, name: str, version: int, path: Path, runtime: RuntimeConfig, metrics: Metrics) -> None:
        self.name = name
        self.version = version
        self.path = path
        self.runtime = runtime
        self.metrics = metrics
        self.state = ModelState.LOADING
        self.reason = ""
        self.stats = ModelStats()
        self.fingerprint = package_fingerprint(path)
        self.task = ""
        self.loaded: _Loaded | None = None
        self.batcher: DynamicBatcher | None = None
        self.inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # ------------------------------------------------------------------ status

    @property
    def serving(self) -> bool:
        return self.state is ModelState.SERVING

    @property
    def manifest(self) -> dict[str, Any]:
        assert self.loaded is not None
        return self.loaded.package.manifest

    def status(self) -> ModelStatus:
        return ModelStatus(name=self.name, version=self.version, task=self.task, state=self.state, reason=self.reason)

    # ------------------------------------------------------------------ lifecycle

    async def load(self) -> bool:
        """Verifies, builds and warms up the version; True when it is SERVING."""
        started = time.perf_counter()
        try:
            loaded = await asyncio.get_running_loop().run_in_executor(None, self._build)
            if loaded.engine is not None:
                await loaded.engine.start()
        except PackageError as exc:
            return self._fail(str(exc))
        except Exception as exc:  # never let one bad package take the server down
            log.exception("loading %s/%d crashed", self.name, self.version)
            return self._fail(f"load failed: {exc}")
        self.loaded = loaded
        if loaded.encoder is not None:
            pad = loaded.package.manifest.get("special_tokens", {}).get("pad")
            self.batcher = DynamicBatcher(loaded.runner.run, pad if isinstance(pad, int) else 0,
                                          self.runtime.batch, self.metrics, self.name, self.stats)
            self.batcher.start()
        self.state = ModelState.SERVING
        self.metrics.model_state.labels(self.name, str(self.version)).set(1)
        log.info("model %s version %d SERVING (%s, variant %s, %s) in %.2fs", self.name, self.version, self.task,
                 loaded.variant, ",".join(loaded.runner.providers), time.perf_counter() - started,
                 extra={"model": self.name, "version": self.version})
        return True

    def _fail(self, reason: str) -> bool:
        self.state = ModelState.NOT_SERVING
        self.reason = reason
        self.metrics.model_state.labels(self.name, str(self.version)).set(0)
        log.error("model %s version %d NOT_SERVING: %s", self.name, self.version, reason,
                  extra={"model": self.name, "version": self.version})
        return False

    def _build(self) -> _Loaded:
        """Runs in a worker thread: everything slow (hashing, session creation, warm-up)."""
        package = read_package(self.path, self.name, self.version)
        self.task = package.task
        manifest = package.manifest
        variant = choose_variant(manifest, self.runtime.session.variant, self.runtime.session.device)
        tokenizer_file = "tokenizer.json"
        verify_files(package, ["model.json", manifest["variants"][variant], tokenizer_file])
        if not package.file(tokenizer_file).is_file():
            raise PackageError("tokenizer.json missing")
        session = create_session(package, variant, self.runtime.session)
        runner = SessionRunner(session)
        encoder: TextEncoder | None = None
        engine: GenerationEngine | None = None
        try:
            if package.task == "generate":
                encoder_tokenizer = TextEncoder(package.file(tokenizer_file), manifest["max_length"]).tokenizer
                engine = GenerationEngine(session, manifest, encoder_tokenizer, self.runtime.generation,
                                          self.metrics, self.name)
                engine.warmup()
            else:
                encoder = TextEncoder(package.file(tokenizer_file), manifest["max_length"])
                warm_up_encoder(runner, manifest, self.runtime.batch.max_batch_size)
        except PackageError:
            raise
        except Exception as exc:  # tokenizer parse errors, DecoderSpec ValueErrors, graph failures
            raise PackageError(f"warm-up failed: {exc}") from None
        return _Loaded(package=package, variant=variant, session=session, runner=runner, encoder=encoder,
                       engine=engine, inputs=specs_from_manifest(manifest["inputs"]),
                       outputs=specs_from_manifest(manifest["outputs"]))

    def acquire(self) -> None:
        """Counts a request in; call only on a SERVING version (the repository checks), release() after."""
        self.inflight += 1
        self._idle.clear()

    def release(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._idle.set()

    def retire(self) -> None:
        """No new requests from now on (the caller closes it once drained)."""
        if self.state is ModelState.SERVING:
            self.metrics.model_state.labels(self.name, str(self.version)).set(0)
        self.state = ModelState.UNLOADED
        self.reason = ""

    async def close(self, drain_timeout: float | None = None) -> None:
        """Waits for in-flight requests (up to drain_timeout), then frees the session."""
        try:
            await asyncio.wait_for(self._idle.wait(), drain_timeout)
        except TimeoutError:
            log.warning("model %s version %d closed with %d requests still running", self.name, self.version,
                        self.inflight)
        if self.batcher is not None:
            await self.batcher.stop()
            self.batcher = None
        if self.loaded is not None and self.loaded.engine is not None:
            await self.loaded.engine.stop()
        self.loaded = None
        self.metrics.model_state.labels(self.name, str(self.version)).set(0)
        log.info("model %s version %d unloaded", self.name, self.version)


def package_fingerprint(path: Path) -> tuple[tuple[str, int, int], ...]:
    """Changes when a package is rewritten (used to retry a failed version only after it changed).

    Every file counts, not just model.json / parity.json: a version copied in place file by file may get
    its manifest and parity report before its graph, and must be retried once the graph is complete.
    """
    stamps = []
    try:
        entries = sorted(path.iterdir())
    except OSError:
        return ()
    for entry in entries:
        try:
            st = entry.stat()
        except OSError:
            continue
        stamps.append((entry.name, st.st_size, st.st_mtime_ns))
    return tuple(stamps)
