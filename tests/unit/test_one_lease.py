"""One lease per request: a request that takes two steps on a model (chat: the template, then the generation;
KServe ModelInfer: the version's task, then its call) resolves the version once, so a version swap that lands
between the steps cannot mix two versions, and the version's statistics count the request once.

In process, with a stand-in repository that counts its look-ups and served models that record their calls (the
real repository and models are exercised by tests/e2e/http/test_openai_and_plain_http.py, tests/e2e/grpc/test_server_rpcs.py and
tests/unit/test_modelpkg.py).
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, AsyncIterator

import numpy as np

from server.dataplane import DataPlane
from server.generation import GenerationParams
from server.protocol.types import ChatTemplate
from server.runtime.settings import ServerSettings
from server.runtime.stats import ModelStats

MESSAGES = [{"role": "user", "content": "hi"}]


class Served:
    """A served model of one version: its chat template names the version; every call is recorded."""

    def __init__(self, version: int, task: str, repository: "Repository") -> None:
        self.name, self.version, self.task, self._repository = "m", version, task, repository
        self.calls: list[tuple[str, Any]] = []

    def chat_template(self) -> ChatTemplate:
        self._repository.swap()          # a new version starts serving right after this one's template is read
        return ChatTemplate("{{ messages[0]['content'] }} (template of v%d)" % self.version)

    async def generate_many(self, jobs: list[Any], deadline: float | None, field: str) -> list[Any]:
        self.calls.append(("generate_many", [prompt for prompt, _ in jobs]))
        return [SimpleNamespace(text=f"from v{self.version}", finish_reason="stop") for _ in jobs]

    async def stream_many(self, jobs: list[Any], deadline: float | None, field: str) -> list[AsyncIterator[Any]]:
        self.calls.append(("stream_many", [prompt for prompt, _ in jobs]))

        async def one() -> AsyncIterator[Any]:
            yield SimpleNamespace(final=True, tokens=[], text=f"from v{self.version}")
        return [one() for _ in jobs]

    async def embed(self, texts: list[str], truncate: bool, deadline: float | None,
                    dimensions: int | None = None) -> Any:
        self.calls.append(("embed", texts))
        self._repository.swap()          # the swap lands while the request computes
        return SimpleNamespace(embeddings=np.full((len(texts), 2), self.version, dtype=np.float32))


class Version:
    """What the data plane's lease needs of a repository version."""

    def __init__(self, version: int, task: str, repository: "Repository") -> None:
        self.name, self.version, self.task = "m", version, task
        self.model = Served(version, task, repository)
        self.stats = ModelStats()
        self.inflight = 0

    def acquire(self) -> None:
        self.inflight += 1

    def release(self) -> None:
        self.inflight -= 1


class Repository:
    """Two versions of model "m": 1 serves until swap(), then 2; every look-up is counted."""

    def __init__(self, task: str) -> None:
        self.versions = [Version(1, task, self), Version(2, task, self)]
        self.latest = self.versions[0]
        self.lookups = 0

    def swap(self) -> None:
        self.latest = self.versions[1]

    def resolve(self, name: str, version: int = 0, field_name: str = "model") -> Version:
        self.lookups += 1
        return self.latest

    def find(self, name: str, version: int = 0) -> Version:
        self.lookups += 1
        return self.latest


def _plane(tmp_path: Path, task: str) -> tuple[DataPlane, Repository]:
    plane = DataPlane(ServerSettings(repository=tmp_path, providers=["CPUExecutionProvider"]))
    repository = Repository(task)
    plane.repository = repository  # type: ignore[assignment]
    return plane, repository


def _counted(version: Version) -> tuple[int, int]:
    """(successes, failures) in the version's statistics."""
    snapshot = version.stats.snapshot(version.name, version.version)
    return snapshot.success.count, snapshot.fail.count


def test_chat_renders_and_generates_on_the_one_version_it_leased(tmp_path: Path) -> None:
    plane, repository = _plane(tmp_path, "generate")
    params = [GenerationParams.validate(max_new_tokens=4)] * 2
    results = asyncio.run(plane.chat("m", 0, MESSAGES, params))
    v1, v2 = repository.versions
    assert repository.lookups == 1
    assert [(r.model, r.version, r.output.text) for r in results] == [("m", 1, "from v1")] * 2
    assert v1.model.calls == [("generate_many", ["hi (template of v1)"] * 2)] and v2.model.calls == []
    assert _counted(v1) == (1, 0) and _counted(v2) == (0, 0)
    assert v1.inflight == 0 and plane.inflight == 0


def test_streamed_chat_holds_the_one_lease_to_its_last_stream(tmp_path: Path) -> None:
    plane, repository = _plane(tmp_path, "generate")

    async def run() -> list[list[Any]]:
        streams = await plane.chat_streams("m", 0, MESSAGES, [GenerationParams.validate(max_new_tokens=4)] * 2)
        assert plane.inflight == 1      # one request in flight, for both of its streams
        return [[part async for part in stream] for stream in streams]

    parts = asyncio.run(run())
    v1, v2 = repository.versions
    assert repository.lookups == 1
    assert [(p.version, p.chunk.text) for stream in parts for p in stream] == [(1, "from v1")] * 2
    assert v1.model.calls == [("stream_many", ["hi (template of v1)"] * 2)] and v2.model.calls == []
    assert _counted(v1) == (1, 0) and _counted(v2) == (0, 0) and plane.inflight == 0


def test_kserve_text_mode_resolves_once_and_answers_from_that_version(tmp_path: Path) -> None:
    plane, repository = _plane(tmp_path, "embed")
    texts = np.array([b"a", b"b"], dtype=object)
    result = asyncio.run(plane.model_infer("m", 0, {"text": texts}, None, {}))
    v1, v2 = repository.versions
    assert repository.lookups == 1
    assert (result.model, result.version) == ("m", 1)
    assert result.outputs["embedding"].tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert v1.model.calls == [("embed", ["a", "b"])] and v2.model.calls == []
    assert _counted(v1) == (1, 0) and _counted(v2) == (0, 0) and plane.inflight == 0
