"""Where a step's metrics go: one small class per destination.

``MetricsReporter`` derives a step once and calls ``write`` on each sink of the reporting
rank, ``write_eval`` for each validation pass and ``event`` for what is neither; ``close`` is
called once at the end with how the run ended. The standard sinks
(metrics.jsonl, the console's ``[TRAIN]`` line, TensorBoard) fail loudly; experiment
trackers (``trackers.py``: W&B, MLflow) never fail a run.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

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


def standard_sinks(run_dir: Path, *, enable_tensorboard: bool = True) -> list[MetricSink]:
    """metrics.jsonl first (the record of truth), then the console line, then TensorBoard."""
    from primus.runtime.rundir import RunDir
    from primus.runtime.sinks.console import ConsoleSink
    from primus.runtime.sinks.jsonl import JsonlSink
    from primus.runtime.sinks.tensorboard import tensorboard_sink

    sinks: list[MetricSink] = [JsonlSink(RunDir(run_dir).metrics), ConsoleSink()]
    if enable_tensorboard and (tb := tensorboard_sink(run_dir / "tensorboard")) is not None:
        sinks.append(tb)
    return sinks
