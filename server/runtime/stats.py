"""Per model-version counters behind KServe ModelStatistics (Prometheus has the same, labelled, in metrics)."""
from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

from server.protocol.types import BatchStat, DurationStat, ModelStatistics


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.ns += int(seconds * 1e9)

    def frozen(self) -> DurationStat:
        return DurationStat(count=self.count, ns=self.ns)


@dataclass
class ModelStats:
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    inference_count: int = 0   # rows inferred
    execution_count: int = 0   # onnxruntime runs
    last_inference_ms: int = 0
    batches: dict[int, Duration] = field(default_factory=lambda: defaultdict(Duration))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record_request(self, ok: bool, seconds: float) -> None:
        with self._lock:
            (self.success if ok else self.fail).add(seconds)

    def record_execution(self, rows: int, seconds: float, queue_seconds: list[float] | None = None) -> None:
        with self._lock:
            self.execution_count += 1
            self.inference_count += rows
            self.last_inference_ms = int(time.time() * 1000)
            self.compute_infer.add(seconds)
            self.batches[rows].add(seconds)
            for q in queue_seconds or ():
                self.queue.add(q)

    def snapshot(self, name: str, version: int) -> ModelStatistics:
        """A consistent copy of every counter (taken under the lock the compute threads write under)."""
        with self._lock:
            return ModelStatistics(
                name=name, version=version, last_inference_ms=self.last_inference_ms,
                inference_count=self.inference_count, execution_count=self.execution_count,
                success=self.success.frozen(), fail=self.fail.frozen(), queue=self.queue.frozen(),
                compute_infer=self.compute_infer.frozen(),
                batches=[BatchStat(size, d.frozen()) for size, d in sorted(self.batches.items())])
