"""The model repository: `<root>/<name>/<version>/` packages, their loaded versions, and routing.

Version policy: the latest version on disk is loaded and serves requests that name no version (if it
fails and nothing else serves, the next older version is tried). A new
version is swapped in without failed requests: it loads and warms up beside the old one, becomes
SERVING (new requests now route to it), then the old one is retired (no new requests) and closed once
its in-flight requests are done. If the new version fails, the old one keeps serving.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path

from modelpkg import MANIFEST_FILE, PARITY_FILE, Building, parse_version, read_building, valid_name
from server.protocol.errors import Code, ServingError
from server.runtime.metrics import Metrics
from server.model import RuntimeConfig
from server.protocol.types import ModelState, ModelStatus, RepositoryEntry
from server.repository.version import ModelVersion, package_fingerprint

log = logging.getLogger(__name__)


@dataclass
class _Slot:
    """Everything known about one model name."""

    versions: dict[int, ModelVersion] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    unloaded_by_request: bool = False  # the poller leaves it alone until an explicit load

    def latest_serving(self) -> ModelVersion | None:
        serving = [m for m in self.versions.values() if m.serving]
        return max(serving, key=lambda m: m.version) if serving else None


class ModelRepository:
    def __init__(self, root: Path, runtime: RuntimeConfig, metrics: Metrics, drain_timeout: float = 60.0) -> None:
        self.root = root.resolve()
        self.runtime = runtime
        self.metrics = metrics
        self.drain_timeout = drain_timeout
        self._slots: dict[str, _Slot] = {}
        # Names the deploy pipeline is still building (modelpkg.building), with no version loaded yet.
        self.building: dict[str, Building] = {}
        self._closing: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ paths and names

    def model_dir(self, name: str, field_name: str = "model") -> Path:
        """The directory of a model name; INVALID_ARGUMENT for names that could leave the repository."""
        if not valid_name(name):
            raise ServingError.invalid(field_name, f"invalid model name {name!r} "
                                                   "(letters, digits, '_', '.', '-'; 1-128 characters)")
        path = (self.root / name).resolve()
        if path.parent != self.root:
            raise ServingError.invalid(field_name, f"model name {name!r} resolves outside the repository")
        return path

    def scan(self) -> dict[str, list[int]]:
        """Model names on disk -> versions that are complete packages (have model.json and parity.json)."""
        try:
            return self._scan()
        except OSError as exc:
            log.error("cannot list repository %s: %s", self.root, exc)
            return {}

    def _scan(self) -> dict[str, list[int]]:
        """scan(), raising OSError when the repository itself cannot be listed."""
        found: dict[str, list[int]] = {}
        for entry in sorted(self.root.iterdir()):
            if not entry.is_dir() or not valid_name(entry.name) or entry.resolve().parent != self.root:
                continue
            versions = sorted(v for v in (parse_version(d.name) for d in self._children(entry)) if v is not None
                              and self._is_package(entry / str(v)))
            found[entry.name] = versions
        return found

    @staticmethod
    def _children(path: Path) -> list[Path]:
        """Version directories; like model directories, one that resolves elsewhere (a symlink) is ignored."""
        try:
            real = path.resolve()
            return [d for d in path.iterdir() if d.is_dir() and d.resolve().parent == real]
        except OSError:
            return []

    @staticmethod
    def _is_package(path: Path) -> bool:
        return (path / MANIFEST_FILE).is_file() and (path / PARITY_FILE).is_file()

    # ------------------------------------------------------------------ routing

    def resolve(self, name: str, version: int = 0, field_name: str = "model") -> ModelVersion:
        """The SERVING version to use (0 = latest); NOT_FOUND / UNAVAILABLE otherwise. Does not await."""
        slot = self._slots.get(name)
        if slot is None or not slot.versions:
            self.model_dir(name, field_name)  # a name that was never loaded: say when it is not even a valid one
            building = self.building.get(name)
            if building is not None:
                raise ServingError(Code.UNAVAILABLE, f"model {name!r} is being built: {building.describe()}")
            raise ServingError(Code.NOT_FOUND, f"{field_name}: unknown model {name!r}")
        if version < 0:
            raise ServingError.invalid("version", f"must be >= 0, got {version}")
        if version == 0:
            model = slot.latest_serving()
            if model is None:
                latest = slot.versions[max(slot.versions)]
                why = f": {latest.reason}" if latest.reason else ""
                raise ServingError(Code.UNAVAILABLE, f"model {name!r} is {latest.state.value}{why}")
            return model
        model = slot.versions.get(version)
        if model is None:
            raise ServingError(Code.NOT_FOUND, f"version: model {name!r} has no version {version} "
                                               f"(known: {sorted(slot.versions)})")
        if not model.serving:
            why = f": {model.reason}" if model.reason else ""
            raise ServingError(Code.UNAVAILABLE, f"model {name!r} version {version} is {model.state.value}{why}")
        return model

    def find(self, name: str, version: int = 0) -> ModelVersion | None:
        """The version to report on (any state): the given one, else latest SERVING, else the newest."""
        slot = self._slots.get(name)
        if slot is None or not slot.versions:
            return None
        if version:
            return slot.versions.get(version)
        return slot.latest_serving() or slot.versions[max(slot.versions)]

    def versions(self, name: str) -> list[int]:
        slot = self._slots.get(name)
        return sorted(slot.versions) if slot else []

    def statuses(self) -> list[ModelStatus]:
        """Every version of every loaded name, and each name still being built (version 0, state BUILDING)."""
        loaded = [m.status() for name in sorted(self._slots) for _, m in sorted(self._slots[name].versions.items())]
        return sorted(loaded + [self.building_status(n) for n in self.building], key=lambda s: (s.name, s.version))

    def index(self, ready_only: bool = False) -> list[RepositoryEntry]:
        """KServe's repository index: every version known (any state) and name being built, then names on disk never
        loaded (unless ready_only)."""
        entries = []
        known = set()
        for s in self.statuses():
            known.add(s.name)
            if ready_only and s.state is not ModelState.SERVING:
                continue
            entries.append(RepositoryEntry(name=s.name, version=s.version, state=s.state, reason=s.reason))
        if not ready_only:
            for name, versions in sorted(self.scan().items()):
                if name not in known:  # on disk, never loaded (e.g. appeared since the last poll)
                    entries.append(RepositoryEntry(name=name, version=versions[-1] if versions else None,
                                                   state=ModelState.UNLOADED, reason="not loaded"))
        return entries

    def building_status(self, name: str) -> ModelStatus:
        building = self.building[name]
        return ModelStatus(name=name, version=0, task=building.task, state=ModelState.BUILDING,
                           reason=building.describe())

    def models(self) -> list[ModelVersion]:
        return [m for name in sorted(self._slots) for _, m in sorted(self._slots[name].versions.items())]

    @property
    def names(self) -> list[str]:
        return sorted(self._slots)

    def knows(self, name: str) -> bool:
        """A name loaded at least once (slots are only made for names model_dir accepted)."""
        return name in self._slots

    # ------------------------------------------------------------------ load / unload

    async def load_all(self) -> None:
        """Initial load: the latest version of every model, in parallel."""
        found = self.scan()
        await asyncio.gather(*(self.load(name, explicit=False) for name, versions in found.items() if versions))
        self._read_building(found)
        for name, versions in found.items():
            if not versions and name not in self.building:
                log.warning("model directory %s holds no complete package", name)

    async def load(self, name: str, explicit: bool = True) -> ModelVersion:
        """Loads (or reloads) the latest version on disk and swaps it in; returns the new version object."""
        path = self.model_dir(name, "model_name")
        if not path.is_dir():
            raise ServingError(Code.NOT_FOUND, f"model_name: no model {name!r} in the repository")
        slot = self._slots.setdefault(name, _Slot())
        async with slot.lock:
            versions = [v for v in (parse_version(d.name) for d in self._children(path)) if v is not None
                        and self._is_package(path / str(v))]
            if not versions:
                raise ServingError(Code.NOT_FOUND, f"model_name: {name!r} has no complete version directory")
            if explicit:
                slot.unloaded_by_request = False
            versions.sort(reverse=True)
            model = await self._swap_in(name, slot, versions[0])
            # Nothing serves (a cold start whose latest version is broken): fall back to older versions.
            for older in versions[1:]:
                if model.serving or slot.latest_serving() is not None:
                    break
                log.warning("model %s: version %d failed, trying version %d", name, model.version, older)
                await self._swap_in(name, slot, older)
            return model

    async def _swap_in(self, name: str, slot: _Slot, version: int) -> ModelVersion:
        new = ModelVersion(name, version, self.root / name / str(version), self.runtime, self.metrics)
        current = slot.versions.get(version)
        if current is None or not current.serving:
            slot.versions[version] = new  # visible as LOADING
        ok = await new.load()
        if not ok:
            if current is not None and current.serving:
                log.warning("reload of %s version %d failed; the loaded copy keeps serving", name, version)
            else:
                slot.versions[version] = new  # NOT_SERVING with its reason
            return new
        slot.versions[version] = new
        if current is not None and current is not new:
            self._retire(current)
        for other in list(slot.versions.values()):
            # Older failures are history once a newer version serves; a newer failure stays visible (with its
            # reason) so the poller does not retry it until its files change.
            if other.version != version and (other.state is ModelState.SERVING or (
                    other.state is ModelState.NOT_SERVING and other.version < version)):
                self._retire(other)
        return new

    def _retire(self, model: ModelVersion) -> None:
        was_loaded = model.loaded
        model.retire()
        if was_loaded:
            task = asyncio.get_running_loop().create_task(model.close(self.drain_timeout))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def unload(self, name: str) -> None:
        self.model_dir(name, "model_name")
        slot = self._slots.get(name)
        if slot is None:
            raise ServingError(Code.NOT_FOUND, f"model_name: unknown model {name!r}")
        async with slot.lock:
            slot.unloaded_by_request = True
            for model in slot.versions.values():
                if model.state is not ModelState.UNLOADED:
                    self._retire(model)

    # ------------------------------------------------------------------ polling

    async def poll_once(self) -> None:
        """Loads new or changed versions, unloads models whose directory disappeared.

        A repository that cannot be listed at all (removed, storage unmounted) is an outage, not an
        instruction to unload: the loaded versions keep serving and the next scan that works resumes polling.
        """
        try:
            found = self._scan()
        except OSError as exc:
            log.error("cannot list repository %s: %s; the loaded models keep serving", self.root, exc)
            return
        for name, slot in list(self._slots.items()):
            if name not in found or not found[name]:
                if any(m.state is not ModelState.UNLOADED for m in slot.versions.values()):
                    log.info("model %s left the repository; unloading", name)
                    await self.unload(name)
                    slot.unloaded_by_request = False
        for name, versions in found.items():
            if not versions:
                continue
            slot = self._slots.get(name)
            if slot is None:
                await self.load(name, explicit=False)
                continue
            if slot.unloaded_by_request or slot.lock.locked():
                continue
            target = versions[-1]
            model = slot.versions.get(target)
            if model is None or model.state is ModelState.UNLOADED:
                await self.load(name, explicit=False)
            elif model.state is ModelState.NOT_SERVING and model.fingerprint != package_fingerprint(model.path):
                await self.load(name, explicit=False)  # the failed package was rewritten: retry
        for model in self.models():
            await model.check_files()  # a loaded version whose files changed on disk says so (its reason)
        self._read_building(found)

    def _read_building(self, found: dict[str, list[int]]) -> None:
        """The build status of each name on disk that has no loaded version (a name is listed once it serves)."""
        building = {}
        for name in found:
            slot = self._slots.get(name)
            if slot is None or not slot.versions:
                status = read_building(self.root / name)
                if status is not None:
                    building[name] = status
        self.building = building

    async def poll_forever(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.poll_once()
            except Exception:  # a broken scan must not stop future scans
                log.exception("repository poll failed")

    async def close(self) -> None:
        for slot in self._slots.values():
            for model in slot.versions.values():
                self._retire(model)
        if self._closing:
            await asyncio.gather(*list(self._closing), return_exceptions=True)
