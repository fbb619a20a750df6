"""Prometheus metrics of the server (documented in docs/metrics.md).

All collectors live in one registry owned by the server process, so tests can start several servers in
one interpreter without duplicate-registration errors and the HTTP exporter serves exactly these.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    """One instance per server; pass it to whatever records."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "ortserve_requests", "RPCs answered, by model, method and gRPC status code.",
            ["model", "method", "code"], registry=r)
        self.request_latency = Histogram(
            "ortserve_request_latency_seconds", "Wall time of an RPC from arrival to answer.",
            ["model", "method"], buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram(
            "ortserve_queue_time_seconds", "Time a request waited in a batcher queue before its batch ran.",
            ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram(
            "ortserve_batch_size", "Rows per onnxruntime run of an encoder batch or a decoder step.",
            ["model"], buckets=_BATCH_BUCKETS, registry=r)
        self.time_to_first_token = Histogram(
            "ortserve_time_to_first_token_seconds", "From a generation request's arrival to its first token.",
            ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.inter_token_latency = BatchHistogram(
            "ortserve_inter_token_latency_seconds", "Time between two consecutive tokens of one sequence.",
            _LATENCY_BUCKETS, registry=r)
        self.generated_tokens = Counter(
            "ortserve_generated_tokens", "Tokens produced by generation.", ["model"], registry=r)
        self.active_sequences = Gauge(
            "ortserve_active_sequences", "Sequences currently in the continuous batch.", ["model"], registry=r)
        self.queued_requests = Gauge(
            "ortserve_queued_requests", "Requests admitted and waiting for compute.", ["model"], registry=r)
        self.cache_slots = Gauge(
            "ortserve_cache_slots", "KV-cache slots of an in-place-cache decoder, by state (used / total).",
            ["model", "state"], registry=r)
        self.kv_cache_usage = Gauge(
            "ortserve_kv_cache_usage_ratio", "Share of a decoder's KV-cache slots in use (0-1): with "
            "ortserve_queued_requests, what a load-aware router (the Kubernetes inference gateway) reads.",
            ["model"], registry=r)
        self.prefill_chunks = Counter(
            "ortserve_prefill_chunks", "Prompt chunks prefilled (a long prompt is cut into several).",
            ["model"], registry=r)
        self.prefill_tokens = Counter(
            "ortserve_prefill_tokens", "Prompt tokens prefilled.", ["model"], registry=r)
        self.prefix_reused_tokens = Counter(
            "ortserve_prefix_reused_tokens", "Prompt tokens not prefilled: a cache slot held them "
            "(prefix caching).", ["model"], registry=r)
        self.overlapped_steps = Counter(
            "ortserve_overlapped_steps", "Generation: decode steps the engine's thread computed while its loop "
            "applied the step before (--overlap-step-ms).", ["model"], registry=r)
        self.tokens_in_flight = Gauge(
            "ortserve_tokens_in_flight", "Generation: prompt + max_new_tokens summed over a decoder's admitted "
            "requests (waiting, prefilling, decoding); never above max_tokens_in_flight.", ["model"], registry=r)
        self._request_children: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        self._generation_gauges: dict[str, GenerationGauges] = {}
        self.model_state = Gauge(
            "ortserve_model_ready", "1 when a model version is SERVING, else 0.", ["model", "version"], registry=r)

    def generation_gauges(self, model: str) -> "GenerationGauges":
        """The one gauge set of a generative model, shared by its engines (--generation-instances)."""
        found = self._generation_gauges.get(model)
        if found is None:
            found = self._generation_gauges[model] = GenerationGauges(self, model)
        return found

    def record_request(self, model: str, method: str, code: str, seconds: float) -> None:
        """One answered request. The labelled children are looked up once per (model, method, code): labels()
        takes a lock and builds its key on every call, a measurable part of a short request (bench/FINDINGS.md)."""
        key = (model, method, code)
        children = self._request_children.get(key)
        if children is None:
            children = self._request_children[key] = (self.requests.labels(model, method, code),
                                                      self.request_latency.labels(model, method))
        children[0].inc()
        children[1].observe(seconds)


class BatchHistogram(Collector):
    """A histogram labelled by model that takes an iteration's observations in one call (`observe_many`).

    A decoder step gives every running sequence a token, and prometheus_client's Histogram.observe takes a lock
    and walks the buckets per value, once a token (py-spy found it in the event loop's samples on the g2p batch
    job: bench/FINDINGS.md). Here one
    numpy bincount per call adds a step's values to the model's bucket counts. Scraped like a Histogram:
    `_bucket{le=...}` (cumulative), `_count`, `_sum`."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry) -> None:
        self.name, self.documentation = name, documentation
        self.bounds = np.asarray(sorted(buckets), dtype=np.float64)
        self._children: dict[str, _BatchChild] = {}
        self._lock = threading.Lock()
        registry.register(self)

    def labels(self, model: str) -> "_BatchChild":
        with self._lock:
            child = self._children.get(model)
            if child is None:
                child = self._children[model] = _BatchChild(self.bounds)
            return child

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=["model"])

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=["model"])
        les = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        with self._lock:
            children = list(self._children.items())
        for model, child in children:
            counts, total = child.snapshot()
            family.add_metric([model], list(zip(les, np.cumsum(counts).tolist())), total)
        yield family


class _BatchChild:
    def __init__(self, bounds: np.ndarray) -> None:
        self.bounds = bounds
        self.counts = np.zeros(len(bounds) + 1, dtype=np.int64)    # the last: above every bound (+Inf)
        self.sum = 0.0
        self._lock = threading.Lock()   # scrapes read from the exporter's thread

    def observe_many(self, values: Sequence[float]) -> None:
        if not len(values):
            return
        v = np.asarray(values, dtype=np.float64)
        # a value counts in the first bucket whose bound it does not exceed (le: less or equal)
        counts = np.bincount(np.searchsorted(self.bounds, v, side="left"), minlength=len(self.counts))
        total = float(v.sum())
        with self._lock:
            self.counts += counts
            self.sum += total

    def snapshot(self) -> tuple[np.ndarray, float]:
        with self._lock:
            return self.counts.copy(), self.sum


class GenerationGauges:
    """A generative model's load gauges, summed over its engines: each engine reports its own counts (on the event
    loop, after every iteration) and the gauges show the totals, as if one engine held all the slots."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self.active_sequences = metrics.active_sequences.labels(model=model)
        self.queued_requests = metrics.queued_requests.labels(model=model)
        self.tokens_in_flight = metrics.tokens_in_flight.labels(model=model)
        self.slots_used = metrics.cache_slots.labels(model=model, state="used")
        self.slots_total = metrics.cache_slots.labels(model=model, state="total")
        self.kv_cache_usage = metrics.kv_cache_usage.labels(model=model)
        self._engines: dict[object, tuple[int, int, int, int, int]] = {}

    def report(self, engine: object, active: int, queued: int, tokens: int, used: int, total: int) -> None:
        self._engines[engine] = (active, queued, tokens, used, total)
        self._show()

    def forget(self, engine: object) -> None:
        """A stopped engine's counts leave the totals (its model version unloaded, or the server draining)."""
        self._engines.pop(engine, None)
        self._show()

    def _show(self) -> None:
        active, queued, tokens, used, total = (sum(column) for column in zip(*self._engines.values(), (0,) * 5))
        self.active_sequences.set(active)
        self.queued_requests.set(queued)
        self.tokens_in_flight.set(tokens)
        self.slots_used.set(used)
        self.slots_total.set(total)
        self.kv_cache_usage.set(used / max(total, 1))
