"""The reporting rank's fan-out: each step derived once (``metrics.derive``) and written to every sink."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primus.runtime.metrics import EvalMetrics, EvalReport, StepMetrics, StepReport, derive, derive_eval
from primus.runtime.rundir import RunDir
from primus.runtime.sinks import MetricSink
from primus.runtime.sinks.console import ConsoleSink
from primus.runtime.sinks.jsonl import JsonlSink
from primus.runtime.sinks.tensorboard import tensorboard_sink

if TYPE_CHECKING:
    from primus.runtime.averages import StepAverages


class MetricsReporter:
    """Derives each step once and fans it out to the sinks; only the reporting rank (0) has sinks.

    Default sinks: metrics.jsonl, the console line, TensorBoard (if installed and enabled);
    ``extra_sinks`` (experiment trackers) follow them.
    """

    def __init__(self, run_dir: Path, *, rank: int, world_size: int, device: str,
                 peak_tflops: float | None, enable_tensorboard: bool = True,
                 extra_sinks: Sequence["MetricSink"] = (), averages: "StepAverages | None" = None):
        self.rank, self.world_size, self.device, self.peak = rank, world_size, device, peak_tflops
        self.averages = averages  # AMD Primus's log_avg_*: tumbling averages in each record's extra
        self.step_times: list[float] = []  # every step's time, for the end-of-run projection check
        self.sinks: list[MetricSink] = []
        if rank == 0:
            self.sinks = [*standard_sinks(run_dir, enable_tensorboard=enable_tensorboard), *extra_sinks]

    def report(self, report: StepReport) -> StepMetrics:
        metrics = derive(report, world_size=self.world_size, device=self.device, peak_tflops=self.peak)
        self.step_times.append(metrics.step_time)
        if self.averages is not None:
            metrics.extra.update(self.averages.update(metrics))
        for sink in self.sinks:
            sink.write(metrics)
        return metrics

    def report_eval(self, report: EvalReport) -> EvalMetrics:
        metrics = derive_eval(report)
        for sink in self.sinks:
            sink.write_eval(metrics)
        return metrics

    def event(self, record: dict[str, Any]) -> None:
        """Something that is not a step (``{"event": kind, ...}``), to metrics.jsonl on the reporting rank."""
        for sink in self.sinks:
            sink.event(record)

    def close(self, status: str = "completed") -> None:
        """``status``: how the run ended (completed, failed, preempted), for trackers that record it."""
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close(status)


def standard_sinks(run_dir: Path, *, enable_tensorboard: bool = True) -> list[MetricSink]:
    """metrics.jsonl first (the record of truth), then the console line, then TensorBoard."""
    sinks: list[MetricSink] = [JsonlSink(RunDir(run_dir).metrics), ConsoleSink()]
    if enable_tensorboard and (tb := tensorboard_sink(run_dir / "tensorboard")) is not None:
        sinks.append(tb)
    return sinks
