"""What one generation engine records: its tokens' timings, its plans, its load gauges.

Token timings are gathered while an iteration's outcome is applied and put into the metrics once at its end (a step
gives every running sequence a token); a sequence's first-token and last-token instants are kept on it whether or
not the server has metrics (its result's time_to_first_token_ms reads them). The gauges are the model's, shared by
its engines (--generation-instances): each engine reports its own counts under its own key.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .scheduler import Plan, Scheduler
from .sequence import Sequence

if TYPE_CHECKING:
    from server.runtime.metrics import Metrics


class EngineMetrics:
    """One engine's recording: `metrics` None records nothing but the sequences' own token instants."""

    def __init__(self, metrics: "Metrics | None", label: str, scheduler: Scheduler) -> None:
        # Labelled children looked up once: labels() locks and builds a key per call, and these run per token.
        self._model = None if metrics is None else _ModelMetrics(metrics, label)
        self._scheduler = scheduler
        self._times = _TokenTimes()      # an iteration's token timings, recorded at its end

    def tokens_arrive(self) -> None:
        """The instant this iteration's tokens reach their sequences (before its outcome is applied)."""
        self._times.now = time.monotonic()

    def token(self, seq: Sequence) -> None:
        """`seq` got a token this iteration: its first-token latency, or its gap since its last token."""
        times, now = self._times, self._times.now
        if seq.first_token_at is None:
            seq.first_token_at = now
            times.firsts.append(now - seq.arrival)
        else:
            times.gaps.append(now - (seq.last_token_at or now))
        seq.last_token_at = now

    def record_tokens(self) -> None:
        """The iteration's tokens into the metrics (after its outcome is applied, whether or not that failed)."""
        self._times.record(self._model)

    def record_plan(self, plan: Plan, steps: int = 1) -> None:
        m = self._model
        if m is None:
            return
        for _ in range(steps if plan.decode else 0):
            m.batch_size.observe(len(plan.decode))
        if plan.reused_tokens:
            m.prefix_reused_tokens.inc(plan.reused_tokens)
        chunks = sum(len(call.chunks) for call in plan.prefill) + len(plan.tails)
        if chunks:
            m.prefill_chunks.inc(chunks)
            m.prefill_tokens.inc(plan.prefill_tokens)

    def record_overlapped(self, rows: int) -> None:
        """A decode step of `rows` rows computed while the loop applied the step before (loop.EngineLoop._overlaps)."""
        m = self._model
        if m is not None and rows:
            m.batch_size.observe(rows)
            m.overlapped_steps.inc()

    def record_gauges(self) -> None:
        m = self._model
        if m is not None:
            s = self._scheduler
            m.gauges.report(self, len(s.running), len(s.waiting), s.reserved, s.occupied_slots, s.config.num_slots)

    def forget_gauges(self) -> None:
        """The engine stopped: its counts leave the model's totals."""
        if self._model is not None:
            self._model.gauges.forget(self)


@dataclass
class _TokenTimes:
    """The tokens of one iteration's outcome: their time, each sequence's first-token latency or gap since its last
    token, put into the metrics once per iteration (a step gives every running sequence a token)."""
    now: float = 0.0
    firsts: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)

    def record(self, m: "_ModelMetrics | None") -> None:
        if m is not None and (self.firsts or self.gaps):
            m.generated_tokens.inc(len(self.firsts) + len(self.gaps))
            for seconds in self.firsts:
                m.time_to_first_token.observe(seconds)
            m.inter_token_latency.observe_many(self.gaps)
        self.firsts.clear()
        self.gaps.clear()


class _ModelMetrics:
    """One model's children of the engine's metrics (server/runtime/metrics.py)."""

    def __init__(self, metrics: "Metrics", label: str) -> None:
        self.generated_tokens = metrics.generated_tokens.labels(model=label)
        self.time_to_first_token = metrics.time_to_first_token.labels(model=label)
        self.inter_token_latency = metrics.inter_token_latency.labels(model=label)
        self.gauges = metrics.generation_gauges(label)     # shared by the model's engines: their sums
        # Per step (per token at batch 1): looked up once, since labels() locks and builds a key on every call.
        self.batch_size = metrics.batch_size.labels(model=label)
        self.prefill_chunks = metrics.prefill_chunks.labels(model=label)
        self.prefill_tokens = metrics.prefill_tokens.labels(model=label)
        self.prefix_reused_tokens = metrics.prefix_reused_tokens.labels(model=label)
        self.overlapped_steps = metrics.overlapped_steps.labels(model=label)
