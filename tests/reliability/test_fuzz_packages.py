"""Property-based fuzzing (hypothesis) of tampered package files published under a running server (issue 40, kind 1).

Each case copies the classifier's good version 1, tampers with it as drawn (a byte of a listed file flipped, a
file cut short or deleted, a listed file's entry dropped from parity.json or its hash changed, every variant's
verdict turned to "refused", parity.json replaced by other bytes) and publishes it as the next version, the
export's way (staged, then renamed). Whatever was drawn, the tampered version never serves: it goes NOT_SERVING
with a reason; version 1 answers on; the process stays alive without a traceback. Cases:
ORTSERVE_FUZZ_PACKAGE_EXAMPLES (default 12: each waits for the repository poll and a load).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.reliability.test_package_verification import Status, publish
from tests.server_process import ServerProcess, repository_with

from protos import ortserve_pb2 as pb

CLASSIFIER = "tiny-classifier"
EXAMPLES = int(os.environ.get("ORTSERVE_FUZZ_PACKAGE_EXAMPLES", "12"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, print_blob=True, derandomize=EXAMPLES <= 100,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
KINDS = ("flip", "truncate", "delete", "unlist", "rehash", "refuse_variants", "replace_parity")


@pytest.fixture(scope="module")
def server(tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    repo = repository_with(tiny_repository, tmp_path_factory.mktemp("fuzz-packages") / "repo", CLASSIFIER)
    with ServerProcess(repo, ["--poll-interval", "0.2"]) as proc:
        yield proc, repo


def _listed(package: Path) -> list[str]:
    return sorted(json.loads((package / "parity.json").read_text())["files"])


def tamper(package: Path, kind: str, pick: int, offset: int, byte: int, junk: bytes) -> str:
    """Applies one drawn change to a staged copy; what it did, for the failure message."""
    parity_path = package / "parity.json"
    parity = json.loads(parity_path.read_text())
    listed = sorted(parity["files"])
    name = listed[pick % len(listed)]
    target = package / name
    if kind == "flip":
        data = bytearray(target.read_bytes())
        data[offset % len(data)] ^= byte
        target.write_bytes(bytes(data))
    elif kind == "truncate":
        data = target.read_bytes()
        target.write_bytes(data[:offset % len(data)])
    elif kind == "delete":
        target.unlink()
    elif kind == "unlist":
        parity["files"].pop(name)
    elif kind == "rehash":
        parity["files"][name] = hashlib.sha256(junk + name.encode()).hexdigest()
    elif kind == "refuse_variants":
        for verdict in parity["variants"].values():
            verdict.update(passed=False, status="refused: tampered")
    else:
        parity_path.write_bytes(junk)
        return f"parity.json replaced by {junk[:20]!r}"
    if kind in ("unlist", "rehash", "refuse_variants"):
        parity_path.write_text(json.dumps(parity))
    return f"{kind} {name}"


def test_tampered_packages_never_serve(server: tuple[ServerProcess, Path]) -> None:
    proc, repo = server
    status = Status(proc.address)
    published = [1]
    try:
        @FUZZ
        @given(kind=st.sampled_from(KINDS), pick=st.integers(0, 50), offset=st.integers(0, 2 ** 20),
               byte=st.integers(1, 255), junk=st.binary(max_size=64))
        def case(kind: str, pick: int, offset: int, byte: int, junk: bytes) -> None:
            version = published[-1] + 1
            done: list[str] = []
            publish(repo, CLASSIFIER, version, lambda p: done.append(tamper(p, kind, pick, offset, byte, junk)))
            published.append(version)
            state, reason, _ = status.settled(CLASSIFIER, version)
            assert state == "NOT_SERVING" and reason, (done, state, reason)
            request = pb.ClassifyRequest(model=CLASSIFIER, inputs=[pb.TextInput(text="the boat left")])
            assert status.stub.Classify(request, timeout=30).version == 1, done
            assert proc.proc.poll() is None

        case()
        assert (status(CLASSIFIER, 1) or ("",))[0] == "SERVING"
    finally:
        status.channel.close()
    assert len(published) > EXAMPLES // 2, published
    assert "Traceback" not in "".join(proc.lines), proc.output(80)
    print(f"\n{len(published) - 1} tampered versions published, none served")
