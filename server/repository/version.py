"""One model version's lifecycle in the repository: LOADING → SERVING (with its served model) or
NOT_SERVING (with the reason); retiring it (UNLOADED) stops new requests at once, and its model is closed
when its last request is done.
"""
from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from server.protocol.errors import Code, ServingError
from server.runtime.metrics import Metrics
from server.repository.loading import build_model
from server.model import RuntimeConfig, ServedModel
from server.repository.package import PackageError, verify_files
from server.runtime.stats import ModelStats
from server.protocol.types import ModelState, ModelStatus

log = logging.getLogger(__name__)


class ModelVersion:
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
        self._model: ServedModel | None = None  # set while SERVING (and while draining after retirement)
        self.inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # ------------------------------------------------------------------ status

    @property
    def serving(self) -> bool:
        return self.state is ModelState.SERVING

    @property
    def loaded(self) -> bool:
        return self._model is not None

    @property
    def model(self) -> ServedModel:
        """The served model; UNAVAILABLE when this version has none (loading, failed, unloaded)."""
        if self._model is None:
            why = f": {self.reason}" if self.reason else ""
            raise ServingError(Code.UNAVAILABLE, f"model {self.name!r} version {self.version} is "
                                                 f"{self.state.value}{why}")
        return self._model

    def status(self) -> ModelStatus:
        return ModelStatus(name=self.name, version=self.version, task=self.task, state=self.state, reason=self.reason,
                           variant=self._model.variant if self._model is not None else "")

    # ------------------------------------------------------------------ lifecycle

    async def load(self) -> bool:
        """Verifies, builds and warms up the version; True when it is SERVING."""
        started = time.perf_counter()
        try:
            model = await asyncio.get_running_loop().run_in_executor(
                None, build_model, self.path, self.name, self.version, self.runtime, self.metrics, self.stats)
            self.task = model.task
            await model.start()
        except PackageError as exc:
            return self._fail(str(exc))
        except Exception as exc:  # never let one bad package take the server down
            log.exception("loading %s/%d crashed", self.name, self.version)
            return self._fail(f"load failed: {exc}")
        self._model = model
        self.state = ModelState.SERVING
        self.reason = "; ".join(model.notes)   # a variant passed over on this CPU (repository/loading.py)
        self.metrics.model_state.labels(self.name, str(self.version)).set(1)
        log.info("model %s version %d SERVING (%s, variant %s, %s) in %.2fs", self.name, self.version, self.task,
                 model.variant, ",".join(model.providers), time.perf_counter() - started,
                 extra={"model": self.name, "version": self.version})
        return True

    def _fail(self, reason: str) -> bool:
        self.state = ModelState.NOT_SERVING
        self.reason = reason
        if not self.task:
            self.task = _task_of(self.path)
        self.metrics.model_state.labels(self.name, str(self.version)).set(0)
        log.error("model %s version %d NOT_SERVING: %s", self.name, self.version, reason,
                  extra={"model": self.name, "version": self.version})
        return False

    async def check_files(self) -> None:
        """A SERVING version whose files changed on disk since it loaded is re-verified against the hashes it
        loaded with; a mismatch becomes its reason (shown by ListModels / ModelInfo / RepositoryIndex). It keeps
        serving from the copy in memory; publish a new version to replace it."""
        if self._model is None or self.state is not ModelState.SERVING:
            return
        fingerprint = package_fingerprint(self.path)
        if fingerprint == self.fingerprint:
            return
        self.fingerprint = fingerprint
        package = self._model.package
        try:
            await asyncio.get_running_loop().run_in_executor(None, verify_files, package, [])
        except PackageError as exc:
            reason = f"files changed on disk since it was loaded ({exc}); the loaded copy keeps serving"
            if reason != self.reason:
                log.error("model %s version %d: %s", self.name, self.version, reason,
                          extra={"model": self.name, "version": self.version})
            self.reason = reason
            return
        if self.reason:
            log.info("model %s version %d: files on disk match again", self.name, self.version,
                     extra={"model": self.name, "version": self.version})
        self.reason = ""

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
        model, self._model = self._model, None
        if model is not None:
            await model.close()
        self.metrics.model_state.labels(self.name, str(self.version)).set(0)
        log.info("model %s version %d unloaded", self.name, self.version)


def _task_of(path: Path) -> str:
    """The task a failed package declares, when its manifest says (for status reports only)."""
    try:
        from server.repository.package import read_package
        return read_package(path, "", 0).task
    except Exception:  # a broken package has no task to report
        return ""


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
