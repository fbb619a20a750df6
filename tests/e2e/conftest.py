"""What the e2e modules share: a default `server` (the shared tiny repository, its HTTP and metrics ports on; one per
module that uses it; a module that needs other settings defines its own `server`) and the task API's stub on it."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import grpc
import pytest

from protos import ortserve_pb2_grpc as pb_grpc
from tests.server_process import ServerProcess


@pytest.fixture(scope="module")
def server(tiny_repository: Path) -> Iterator[ServerProcess]:
    with ServerProcess(tiny_repository, ["--http-port", "0", "--metrics-port", "0"]) as proc:
        yield proc


@pytest.fixture(scope="module")
def tasks(server: ServerProcess) -> Iterator[pb_grpc.TaskServiceStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.TaskServiceStub(channel)
