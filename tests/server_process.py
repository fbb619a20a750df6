"""A real server process on a free localhost port, for the tests: the shared launcher (testing/launch.py)
plus one-server-per-pytest-process and repository-copy helpers, and what tests of a running server share: waiting
until it is ready, its metrics address, an RPC's error, a metric's sample.
"""
from __future__ import annotations

import atexit
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import grpc
import pytest

from testing import launch
from testing.launch import ROOT, ServerStartError, free_port

__all__ = ["ROOT", "ServerProcess", "ServerStartError", "free_port", "shared_server", "repository_with",
           "staggered_streams", "wait_ready", "metrics_url_of", "rpc_error", "sample"]

_METRICS_LINE = re.compile(r"metrics on (\S+):(\d+)")


class ServerProcess(launch.ServerProcess):
    """The launcher with one OpenMP thread per server: the test machine's 2 cores are shared by many servers."""

    def __init__(self, repository: Path, extra_args=(), **kwargs) -> None:  # type: ignore[no-untyped-def]
        kwargs["env"] = {"OMP_NUM_THREADS": "1", **kwargs.get("env", {})}
        super().__init__(repository, extra_args, **kwargs)


_SHARED: dict[Path, ServerProcess] = {}


def shared_server(repository: Path) -> ServerProcess:
    """One server per repository for the whole pytest process, whichever test module asks first.

    (A session fixture defined here and imported by several modules would start one per module.)
    """
    server = _SHARED.get(repository)
    if server is None or server.proc.poll() is not None:
        server = _SHARED[repository] = ServerProcess(repository)
        atexit.register(server.stop)
    return server


def repository_with(source: Path, dest: Path, *names: str) -> Path:
    """A copy of some packages of a (read-only, shared) repository: a server that loads less starts faster."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copytree(source / name, dest / name)
    return dest


def staggered_streams(address: str, model: str, prompts: list[str], new_tokens: list[int],
                      stagger: float = 0.02) -> list[list[int]]:
    """Every prompt as a GenerateStream of its own (ignore_eos), started `stagger` s apart so they join a batch
    that is already running; the streamed token ids per prompt."""
    from clients import OrtserveClient

    def one(i: int) -> list[int]:
        time.sleep(stagger * i)
        with OrtserveClient(address, timeout=60) as client:
            ids: list[int] = []
            for chunk in client.generate_stream(prompts[i], model, max_new_tokens=new_tokens[i], ignore_eos=True):
                ids += [t.token_id for t in chunk.tokens]
            return ids

    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(one, range(len(prompts))))


def wait_ready(address: str, timeout: float = 60.0, **client_args: Any) -> None:
    """Until the server at `address` answers KServe's ServerReady true (tritonclient.grpc's own call)."""
    import tritonclient.grpc as triton
    from tritonclient.utils import InferenceServerException

    client = triton.InferenceServerClient(address, **client_args)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if client.is_server_ready():
                return
        except InferenceServerException:
            pass
        time.sleep(0.1)
    raise AssertionError(f"server at {address} not ready after {timeout}s")


def metrics_url_of(proc: ServerProcess, timeout: float = 30.0) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for line in list(proc.lines):
            match = _METRICS_LINE.search(line)
            if match:
                return f"http://{match.group(1)}:{match.group(2)}/metrics"
        time.sleep(0.05)
    raise AssertionError("no 'metrics on HOST:PORT' line:\n" + "".join(proc.lines))


def rpc_error(call: Callable[[], Any]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def sample(samples: list[Any], name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))
