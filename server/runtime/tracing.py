"""Request tracing (OpenTelemetry, OTLP over gRPC) and request ids for the logs.

Off unless `--otlp-endpoint` is set: then, and only then, opentelemetry's SDK and exporter are imported (the
extra `tracing`), and every request is a trace of these spans (docs/metrics.md, Tracing):

    http.<Route> | grpc.<Method>    SERVER  the door; parent: the caller's W3C `traceparent` (HTTP header or
                                            gRPC metadata) when it sends one
      dataplane.<operation>         INTERNAL admission to the answer (a stream: to its last chunk)
        batcher                     INTERNAL an encoder's rows queued and computed (one per piece)
        engine.first_token          INTERNAL a stream: queued, admitted, prompt prefilled, first token chosen
        engine.decode               INTERNAL a stream: first token to its last

Off, each hook is one test of a module global: no import, no allocation. Spans are passed explicitly where a
request changes task (a stream's chunks are read by the door's response task); inside one task the current
span travels in a ContextVar of our own.

Request ids: the caller's `x-request-id` (header or metadata), else the trace id when tracing, else a
process-unique counter; set per request on a ContextVar that the JSON log formatter writes as `request_id`.
"""
from __future__ import annotations

import contextvars
import itertools
import logging
import os
from typing import Any

log = logging.getLogger(__name__)

_tracer: Any = None          # an opentelemetry Tracer while tracing is on
_propagator: Any = None      # W3C TraceContext
_provider: Any = None
_current: contextvars.ContextVar[Any] = contextvars.ContextVar("ortserve_span", default=None)
# the caller's id (str), or this process's counter (int, formatted only when a record is logged)
request_id: contextvars.ContextVar[str | int | None] = contextvars.ContextVar("ortserve_request_id", default=None)
_ids = itertools.count(1)
_PREFIX = f"{os.getpid():x}"


def enabled() -> bool:
    return _tracer is not None


def configure(endpoint: str | None, service_name: str = "ortserve") -> None:
    """Starts exporting spans to an OTLP/gRPC endpoint (`http://host:4317`); None leaves tracing off."""
    global _tracer, _propagator, _provider
    if not endpoint:
        return
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError as exc:
        raise RuntimeError(f"--otlp-endpoint: tracing needs the extra 'tracing' "
                           f"(pip install 'ortserve[tracing]'): {exc}") from None
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint,
                                                                    insecure=endpoint.startswith("http://"))))
    _provider, _propagator = provider, TraceContextTextMapPropagator()
    _tracer = provider.get_tracer("ortserve")
    log.info("tracing: spans exported to %s (OTLP/gRPC)", endpoint)


def shutdown() -> None:
    """Flushes the spans still batched (at exit)."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


# ---------------------------------------------------------------------------------------------- spans

def _header(headers: Any, name: str) -> str | None:
    get = getattr(headers, "get", None)   # HTTP: Starlette's case-insensitive Headers
    if get is not None:
        return get(name)
    for key, value in headers:           # gRPC: invocation metadata, lower-case keys
        if key == name:
            return value if isinstance(value, str) else None
    return None


def start_door(door: str, method: str, headers: Any) -> Any:
    """The door's span `<door>.<method>`, child of the caller's traceparent if any, and the request id.
    headers: Starlette Headers or gRPC invocation metadata. None when tracing is off."""
    given = _header(headers, "x-request-id")
    if _tracer is None:
        request_id.set(given[:128] if given else next(_ids))
        return None
    from opentelemetry.trace import SpanKind

    traceparent = _header(headers, "traceparent")
    parent = _propagator.extract({"traceparent": traceparent}) if traceparent else None
    span = _tracer.start_span(f"{door}.{method}", context=parent, kind=SpanKind.SERVER)
    request_id.set(given[:128] if given else format(span.get_span_context().trace_id, "032x"))
    return span


def start(name: str, parent: Any = None, **attributes: Any) -> Any:
    """A child span of `parent` (default: the current one); None when off or without a parent."""
    if _tracer is None:
        return None
    parent = parent if parent is not None else _current.get()
    if parent is None:
        return None
    from opentelemetry import trace

    return _tracer.start_span(name, context=trace.set_span_in_context(parent), attributes=attributes or None)


def end(span: Any, error: BaseException | None = None, **attributes: Any) -> None:
    if span is None:
        return
    if attributes:
        span.set_attributes(attributes)
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:200]))
    span.end()


def current() -> Any:
    return _current.get() if _tracer is not None else None


def use(span: Any) -> Any:
    """Makes span current in this task; the token for reset() (None when off)."""
    if span is None:
        return None
    return _current.set(span)


def reset(token: Any) -> None:
    if token is not None:
        try:
            _current.reset(token)
        except ValueError:  # set in another context (a stream's lease ends in the response task)
            pass


class RequestIdFilter(logging.Filter):
    """Adds `request_id` to records logged while a request is being served."""

    def filter(self, record: logging.LogRecord) -> bool:
        rid = request_id.get()
        if rid is not None and not hasattr(record, "request_id"):
            record.request_id = rid if isinstance(rid, str) else f"{_PREFIX}-{rid:x}"
        return True
