"""Where a step's metrics go: one small class per destination.

``MetricsReporter`` (``primus/runtime/reporter.py``, which also picks the standard ones) derives a
step once and calls ``write`` on each sink of the reporting rank, ``write_eval`` for each validation
pass and ``event`` for what is neither; ``close`` is called once at the end with how the run ended.
The standard sinks (metrics.jsonl, the console's ``[TRAIN]`` line, TensorBoard) fail loudly;
experiment trackers (``trackers.py``: W&B, MLflow) never fail a run.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from primus.runtime.metrics import EvalMetrics, StepMetrics


class MetricSink(ABC):
    @abstractmethod
    def write(self, metrics: StepMetrics) -> None:
        """Record one step."""

    @abstractmethod
    def write_eval(self, metrics: EvalMetrics) -> None:
        """Record one validation pass."""

    def event(self, record: dict) -> None:
        """Record an event that is not a step (``{"event": kind, ...}``: a straggler, a worker's end);
        only metrics.jsonl keeps them."""

    def close(self, status: str = "completed") -> None:
        """Flush and release; ``status`` is completed, failed or preempted."""
