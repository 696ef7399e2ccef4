"""Uniform step metrics: one path from every backend to the console, metrics.jsonl and plots.

Backends hand in what they measured (``StepReport``); ``MetricsReporter`` derives the rates
the same way for everyone and prints one ``[TRAIN]`` line per step on the reporting rank.
"""
from __future__ import annotations

import json
import logging
import resource
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from primus.runtime.averages import StepAverages

logger = logging.getLogger("primus.metrics")


@dataclass
class StepReport:
    """What a backend measured for one optimizer step (global numbers, not per rank)."""

    step: int
    loss: float
    step_time_s: float
    samples: int  # global batch size in samples (sequences / clips) for this step
    tokens: int | None = None  # global tokens for this step (LLMs)
    flops: float | None = None  # model FLOPs for this step, all ranks together
    lr: float | None = None
    grad_norm: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepMetrics:
    """The derived, uniform record written to metrics.jsonl."""

    step: int
    loss: float
    step_time: float
    samples_per_sec: float
    samples_per_sec_per_gpu: float
    tokens_per_sec: float | None
    tflops: float | None  # achieved TFLOP/s per device
    mfu: float | None  # fraction of peak, None where the peak is unknown
    mem_gb: float
    lr: float | None = None
    grad_norm: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def peak_memory_gb(device: str) -> float:
    """Peak device memory on GPU; peak resident set size of this process on CPU."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.max_memory_allocated() / 1e9
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss_kb * (1 if sys.platform != "darwin" else 1 / 1024) / 1e6


def derive(report: StepReport, *, world_size: int, device: str, peak_tflops: float | None) -> StepMetrics:
    time_s = max(report.step_time_s, 1e-9)
    tflops = report.flops / time_s / world_size / 1e12 if report.flops else None
    return StepMetrics(
        step=report.step,
        loss=float(report.loss),
        step_time=time_s,
        samples_per_sec=report.samples / time_s,
        samples_per_sec_per_gpu=report.samples / time_s / world_size,
        tokens_per_sec=report.tokens / time_s if report.tokens else None,
        tflops=tflops,
        mfu=(tflops / peak_tflops) if (tflops is not None and peak_tflops) else None,
        mem_gb=peak_memory_gb(device),
        lr=report.lr,
        grad_norm=report.grad_norm,
        extra=dict(report.extra),
    )


def format_train_line(m: StepMetrics) -> str:
    def num(value: float | None, fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    mfu = "n/a" if m.mfu is None else f"{100 * m.mfu:.2f}%"
    return (
        f"[TRAIN] step={m.step} loss={m.loss:.4f} step_time={m.step_time:.3f}s "
        f"samples_per_sec={m.samples_per_sec:.2f} samples_per_sec_per_gpu={m.samples_per_sec_per_gpu:.2f} "
        f"tokens_per_sec={num(m.tokens_per_sec, '.1f')} tflops={num(m.tflops, '.4f')} "
        f"mfu={mfu} mem={m.mem_gb:.2f}GB"
    )


class MetricsReporter:
    """Writes metrics.jsonl, TensorBoard events (if installed) and the console line."""

    def __init__(self, run_dir: Path, *, rank: int, world_size: int, device: str,
                 peak_tflops: float | None, enable_tensorboard: bool = True, averages: "StepAverages | None" = None):
        self.rank, self.world_size, self.device, self.peak = rank, world_size, device, peak_tflops
        self.averages = averages
        self.history: list[StepMetrics] = []
        self._jsonl = None
        self._tb = None
        if rank != 0:
            return
        self.path = run_dir / "metrics.jsonl"
        self._jsonl = self.path.open("a", encoding="utf-8")
        if enable_tensorboard:
            self._tb = _tensorboard_writer(run_dir / "tensorboard")

    def report(self, report: StepReport) -> StepMetrics:
        metrics = derive(report, world_size=self.world_size, device=self.device, peak_tflops=self.peak)
        if self.averages is not None:
            metrics.extra.update(self.averages.update(metrics))
        self.history.append(metrics)
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(vars(metrics)) + "\n")  # flat fields: no deep-copying asdict()
            self._jsonl.flush()
            logger.info(format_train_line(metrics))
        if self._tb is not None:
            self._tb.write(metrics)
        return metrics

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


class _TensorBoardScalars:
    """The step's scalars as ONE TensorBoard event (a Summary with several values, as TensorBoard
    itself writes them): a third of the cost of one ``add_scalar`` call per tag."""

    KEYS = ("loss", "step_time", "samples_per_sec", "tokens_per_sec", "tflops", "mem_gb", "lr")

    def __init__(self, writer, summary_cls):
        self.writer, self.summary_cls = writer, summary_cls

    def write(self, metrics: StepMetrics) -> None:
        values = [self.summary_cls.Value(tag=f"train/{key}", simple_value=float(value))
                  for key in self.KEYS if (value := getattr(metrics, key)) is not None]
        self.writer.file_writer.add_summary(self.summary_cls(value=values), metrics.step)

    def close(self) -> None:
        self.writer.close()


def _tensorboard_writer(path: Path):
    try:
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        logger.info("TensorBoard not installed: skipping event files (pip install tensorboard)")
        return None
    return _TensorBoardScalars(SummaryWriter(str(path)), Summary)
