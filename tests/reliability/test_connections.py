"""Idle connections are closed after a timeout and bounded per door (issue 25, kind 6; server/http/connections.py,
server/runtime/fdlimit.py, server/grpc/server.py).

The outside probe held 1,100 idle connections: the HTTP port had no header-read timeout, the metrics port ran one
thread per connection without a timeout (23 -> 423 threads), and at the default open-file limit every new gRPC call,
HTTP request, metrics scrape and repository poll failed until they closed. Here the server runs with an open-file
limit of 256 (so a few hundred connections reach it) and a header timeout of 2 s:

- hundreds of idle and half-sent-head connections to the HTTP and metrics ports: while they are held, the server's
  descriptors and threads stay bounded, and a new gRPC call, HTTP request, metrics scrape and a newly published
  version (the repository poll) all succeed; after the timeout every one of them has been closed by the server;
- connections to the gRPC port that never send a byte are closed after the handshake timeout (grpc's default
  waits 120 s), and the other ports serve meanwhile.
"""
from __future__ import annotations

import json
import os
import re
import resource
import shutil
import socket
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import grpc
import pytest
from tests.server_process import ServerProcess, repository_with

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc
from testing.launch import wait_for

CLASSIFIER = "tiny-classifier"
OPEN_FILES = 256            # the server's limit: a quarter (64) per door
HEADER_TIMEOUT = 2.0


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _threads(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1))   # type: ignore[union-attr]


def _metrics_url(proc: ServerProcess) -> str:
    found = [m for m in (re.search(r"metrics on (\S+):(\d+)", line) for line in proc.lines) if m]
    return f"http://{found[-1].group(1)}:{found[-1].group(2)}/metrics"


def _get(url: str, timeout: float = 10) -> int:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        response.read()
        return response.status


def _classify(address: str) -> int:
    with grpc.insecure_channel(address) as channel:   # a new connection
        request = pb.ClassifyRequest(model=CLASSIFIER, inputs=[pb.TextInput(text="the boat left the harbour")])
        return pb_grpc.TaskServiceStub(channel).Classify(request, timeout=10).version


def _http_classify(proc: ServerProcess) -> int:
    body = json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                                   "data": ["the boat left the harbour"]}]}).encode()
    request = urllib.request.Request(f"{proc.http_url}/v2/models/{CLASSIFIER}/infer", data=body,
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status


def _open(port: int, n: int, head: bool) -> list[socket.socket]:
    """n connections to the port; with `head`, each sends the start of a request head and never finishes it."""
    socks = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        if head:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: probe\r\nX-Slow-" + str(i).encode())
        socks.append(s)
    return socks


def _closed_by_server(s: socket.socket) -> bool:
    """Whether the server closed it (what it sent before, gRPC's SETTINGS and GOAWAY, is read and dropped)."""
    s.setblocking(False)
    try:
        while True:
            if s.recv(4096) == b"":
                return True
    except BlockingIOError:
        return False
    except OSError:   # reset
        return True


def _all_closed(socks: list[socket.socket]) -> bool:
    return all([_closed_by_server(s) for s in socks])   # every socket read on each poll (no short cut)




@pytest.fixture()
def limited(tiny_repository: Path, tmp_path: Path) -> Iterator[tuple[ServerProcess, Path]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048:   # this process holds the hostile connections
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    repo = repository_with(tiny_repository, tmp_path / "repo", CLASSIFIER)
    args = ["--http-port", "0", "--metrics-port", "0", "--header-timeout", str(HEADER_TIMEOUT),
            "--poll-interval", "0.2"]
    with ServerProcess(repo, args, open_files=OPEN_FILES) as proc:
        yield proc, repo


def test_idle_connections_are_closed_and_every_port_serves_at_the_open_file_limit(
        limited: tuple[ServerProcess, Path]) -> None:
    proc, repo = limited
    pid = proc.proc.pid
    metrics_port = int(_metrics_url(proc).rsplit(":", 1)[1].split("/")[0])
    assert _classify(proc.address) == 1 and _get(_metrics_url(proc)) == 200   # warm: every thread started
    fds_before, threads_before = _fds(pid), _threads(pid)
    hostile: list[socket.socket] = []
    try:
        for port in (proc.http_port, metrics_port):
            hostile += _open(port, 75, head=False) + _open(port, 75, head=True)   # 300: more than the limit
        time.sleep(0.3)
        # While they are held: bounded descriptors and threads, and every port and the poller serve.
        fds_during, threads_during = _fds(pid), _threads(pid)
        assert fds_during < OPEN_FILES - 32, (fds_before, fds_during)
        assert threads_during <= threads_before + 4, (threads_before, threads_during)
        started = time.monotonic()
        assert _classify(proc.address) == 1
        assert _http_classify(proc) == 200
        assert _get(f"{proc.http_url}/v2/health/ready") == 200
        assert _get(_metrics_url(proc)) == 200
        staging = repo / CLASSIFIER / ".tmp-publish"   # the repository poll loads a new version meanwhile
        shutil.copytree(repo / CLASSIFIER / "1", staging)
        os.rename(staging, repo / CLASSIFIER / "2")
        wait_for(lambda: _classify(proc.address) == 2, 20, "version 2 loaded by the poller")
        served_in = time.monotonic() - started
        # After the timeout, the server has closed every one of them.
        wait_for(lambda: _all_closed(hostile), HEADER_TIMEOUT + 5,
              "the server to close the idle connections")
        closed_in = time.monotonic() - started
    finally:
        for s in hostile:
            s.close()
    wait_for(lambda: _fds(pid) <= fds_before + 8, 10, "descriptors back to their level")
    assert any("max_connections" in line and "closed the one idle longest" in line for line in proc.lines)
    print(f"\nfds {fds_before} -> {fds_during} (limit {OPEN_FILES}), threads {threads_before} -> {threads_during}; "
          f"calls on every port + a new version served in {served_in:.2f}s; all closed in {closed_in:.2f}s")


def test_connections_that_never_handshake_on_the_grpc_port_are_closed(
        limited: tuple[ServerProcess, Path]) -> None:
    proc, _ = limited
    silent = _open(proc.port, 100, head=False)   # more than the port's 64: the rest are closed at once
    try:
        assert _http_classify(proc) == 200 and _get(_metrics_url(proc)) == 200
        started = time.monotonic()
        wait_for(lambda: _all_closed(silent), HEADER_TIMEOUT + 5,
              "the server to close the silent gRPC connections")
        closed_in = time.monotonic() - started
    finally:
        for s in silent:
            s.close()
    assert _classify(proc.address) == 1
    print(f"\nsilent gRPC connections closed within {closed_in:.2f}s")


def test_bodies_trickled_a_byte_at_a_time_cannot_hold_the_door(tiny_repository: Path, tmp_path: Path) -> None:
    """The probe's trickle: peers filling the cap with request bodies sent a byte every few seconds (each byte
    restarts the read timer, so the timer never frees them). A new client is served at once: the connection that has
    been sending its body longest is closed to make room, and its request never reached a handler's compute."""
    repo = repository_with(tiny_repository, tmp_path / "repo", CLASSIFIER)
    cap = 12
    args = ["--http-port", "0", "--metrics-port", "0", "--max-connections", str(cap), "--read-timeout", "10"]
    with ServerProcess(repo, args) as proc:
        body = json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x" * 64]}]})
        trickling = []
        try:
            for _ in range(cap):
                s = socket.create_connection(("127.0.0.1", proc.http_port), timeout=10)
                s.sendall(f"POST /v2/models/{CLASSIFIER}/infer HTTP/1.1\r\nHost: probe\r\n"
                          f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body[:5]}".encode())
                trickling.append(s)
            time.sleep(0.5)
            for s in trickling[:3]:
                s.sendall(body[5:6].encode())            # a byte more: still sending, as the probe's did
            started = time.monotonic()
            for _ in range(3):
                assert _http_classify(proc) == 200
                assert _get(f"{proc.http_url}/v2/health/ready") == 200
            served_in = time.monotonic() - started
            assert served_in < 5, served_in
        finally:
            for s in trickling:
                s.close()
        assert any("closed the one sending its request body longest" in line for line in proc.lines)
    print(f"\nsix new requests served in {served_in:.2f}s with the cap ({cap}) full of trickling bodies")
