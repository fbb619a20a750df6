"""Tracing (server/runtime/tracing.py): a real server exports its spans over OTLP/gRPC to a receiver in this process.

One streamed completion over HTTP and one classification over gRPC, each with the caller's W3C traceparent: the
spans are named and parented as docs/metrics.md (Tracing) documents, in the caller's trace. Off by default, the
server imports no opentelemetry; the request id is in the JSON logs; the KV-cache usage gauge is exported.
"""
from __future__ import annotations

import json
import secrets
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent import futures
from pathlib import Path
from typing import Iterator

import grpc
import pytest

from tests.server_process import ROOT, ServerProcess, free_port

pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc", reason="the extra 'tracing' is not installed")

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc  # noqa: E402


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver: keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list = []
        self.lock = threading.Lock()

    def Export(self, request, context):  # noqa: N802 (the RPC's name)
        with self.lock:
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    self.spans.extend(scope.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def of_trace(self, trace_id: str) -> list:
        with self.lock:
            return [s for s in self.spans if s.trace_id.hex() == trace_id]


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[Receiver, int]]:
    sink = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield sink, port
    server.stop(None)


@pytest.fixture(scope="module")
def traced(tiny_repository: Path, receiver: tuple[Receiver, int]) -> Iterator[ServerProcess]:
    _, port = receiver
    args = ["--http-port", "0", "--metrics-port", "0", "--otlp-endpoint", f"http://127.0.0.1:{port}",
            "--log-format", "json", "--log-level", "DEBUG"]
    with ServerProcess(tiny_repository, args, env={"OTEL_BSP_SCHEDULE_DELAY": "100"}) as server:
        yield server


def spans_of(sink: Receiver, trace_id: str, names: set[str], timeout: float = 20) -> dict[str, object]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = {s.name: s for s in sink.of_trace(trace_id)}
        if names <= set(found):
            return found
        time.sleep(0.1)
    raise AssertionError(f"spans {sorted(names - set(found))} never arrived; got {sorted(found)}")


def traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def test_a_streamed_completion_is_one_trace_door_dataplane_engine(traced: ServerProcess,
                                                                    receiver: tuple[Receiver, int]) -> None:
    sink, _ = receiver
    header, trace_id, caller_span = traceparent()
    body = json.dumps({"model": "tiny-gpt", "prompt": "once upon a time", "max_tokens": 12, "stream": True,
                       "ignore_eos": True}).encode()
    request = urllib.request.Request(f"{traced.http_url}/v1/completions", body,
                                     {"content-type": "application/json", "traceparent": header})
    with urllib.request.urlopen(request, timeout=30) as response:
        events = [line for line in response.read().decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"

    spans = spans_of(sink, trace_id, {"http.Completions", "dataplane.generate_streams", "engine.first_token",
                                      "engine.decode"})
    door, plane = spans["http.Completions"], spans["dataplane.generate_streams"]
    first, decode = spans["engine.first_token"], spans["engine.decode"]
    assert door.parent_span_id.hex() == caller_span  # the caller's span is the door's parent
    assert door.kind == door.SPAN_KIND_SERVER
    assert plane.parent_span_id == door.span_id
    assert first.parent_span_id == plane.span_id and decode.parent_span_id == plane.span_id
    assert first.end_time_unix_nano <= decode.start_time_unix_nano <= decode.end_time_unix_nano
    assert door.start_time_unix_nano <= plane.start_time_unix_nano
    assert decode.end_time_unix_nano <= plane.end_time_unix_nano <= door.end_time_unix_nano
    attributes = {a.key: a.value for a in decode.attributes}
    assert attributes["tokens"].int_value == 12
    assert {a.key: a.value.string_value for a in door.attributes}["code"] == "OK"
    # the request id of a traced request is its trace id, in the JSON access log at DEBUG
    logged = [json.loads(line) for line in traced.lines if line.startswith("{") and "Completions" in line]
    assert any(entry.get("request_id") == trace_id for entry in logged), logged[-3:]


def test_a_grpc_classification_with_traceparent_metadata(traced: ServerProcess,
                                                         receiver: tuple[Receiver, int]) -> None:
    from protos import ortserve_pb2 as pb
    from protos import ortserve_pb2_grpc as rpc

    sink, _ = receiver
    header, trace_id, caller_span = traceparent()
    with grpc.insecure_channel(traced.address) as channel:
        rpc.TaskServiceStub(channel).Classify(
            pb.ClassifyRequest(model="tiny-classifier", inputs=[pb.TextInput(text="a fine day")]),
            metadata=[("traceparent", header), ("x-request-id", "req-42")], timeout=30)
    spans = spans_of(sink, trace_id, {"grpc.Classify", "dataplane.classify", "batcher"})
    door, plane, batcher = spans["grpc.Classify"], spans["dataplane.classify"], spans["batcher"]
    assert door.parent_span_id.hex() == caller_span
    assert plane.parent_span_id == door.span_id and batcher.parent_span_id == plane.span_id
    assert {a.key: a.value.int_value for a in batcher.attributes}["rows"] == 1
    logged = [json.loads(line) for line in traced.lines if line.startswith("{") and "req-42" in line]
    assert logged and all(entry["request_id"] == "req-42" for entry in logged)


def test_kv_cache_usage_gauge_beside_the_queue_gauge(traced: ServerProcess) -> None:
    text = traced.metrics_text()
    assert 'ortserve_kv_cache_usage_ratio{model="tiny-gpt"}' in text
    assert 'ortserve_queued_requests{model="tiny-gpt"}' in text
    assert 0.0 <= traced.metric("ortserve_kv_cache_usage_ratio", model="tiny-gpt") <= 1.0


def test_off_by_default_nothing_of_opentelemetry_is_imported() -> None:
    code = ("import sys, server.process, server.__main__, server.http.routes, server.grpc.server, server.dataplane; "
            "bad = sorted({m.split('.')[0] for m in sys.modules} & {'opentelemetry', 'ray', 'torch'}); "
            "print(bad); sys.exit(1 if bad else 0)")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_bad_endpoint_is_one_line(tiny_repository: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "server", "--repository", str(tiny_repository), "--otlp-endpoint",
                          f"127.0.0.1:{free_port()}"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stderr.strip().count("\n") == 0 and "--otlp-endpoint" in run.stderr
