"""Uniform step metrics: one path from every backend to the console, metrics.jsonl and trackers.

Backends hand in what they measured (``StepReport``); ``derive`` computes the rates once, the
same way for everyone; ``primus.runtime.reporter.MetricsReporter`` hands the record to each sink
on the reporting rank (``primus/runtime/sinks/``: metrics.jsonl, the ``[TRAIN]`` console line,
TensorBoard, W&B, MLflow). A new destination is one small sink class. A validation pass takes the
same road (``EvalReport`` -> ``EvalMetrics``: a ``"kind": "eval"`` row in metrics.jsonl, the
``[EVAL]`` line, ``eval/*`` scalars in TensorBoard and the trackers).
"""
from __future__ import annotations

import math
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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
    sample_hash: str | None = None  # digest of the step's global batch (primus.sample_hashes)


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
    time: float | None = None  # when the step ended (Unix time): places it in the run's wall time (goodput)
    sample_hash: str | None = None

    def scalars(self) -> dict[str, float]:
        """Every number of the record but the step and its time, flat (``extra`` keys included), for
        trackers: the same names as metrics.jsonl; fields without a value (None) are left out, not zeroed."""
        out = {key: float(value) for key, value in vars(self).items()
               if key not in ("step", "extra", "time", "sample_hash") and value is not None}
        out.update({key: float(value) for key, value in self.extra.items() if _is_number(value)})
        return out

    def row(self) -> dict[str, Any]:
        """The metrics.jsonl record: every field (None included), ``sample_hash`` only when taken."""
        row = dict(vars(self))  # flat fields: no deep-copying asdict()
        if row["sample_hash"] is None:
            del row["sample_hash"]
        return row


@dataclass
class EvalReport:
    """A validation pass at ``step``: the token-weighted mean loss over the held-out batches."""

    step: int
    loss: float
    name: str = "valid"  # which validation set (a recipe may evaluate several)


@dataclass
class EvalMetrics:
    """The uniform record of one validation pass (a ``"kind": "eval"`` row in metrics.jsonl)."""

    step: int
    loss: float
    ppl: float  # exp(loss): the perplexity of the held-out tokens
    name: str = "valid"

    def scalars(self) -> dict[str, float]:
        """``eval/loss``, ``eval/ppl`` (``eval/<name>/...`` for a set other than the default)."""
        prefix = "eval" if self.name == "valid" else f"eval/{self.name}"
        return {f"{prefix}/loss": float(self.loss), f"{prefix}/ppl": float(self.ppl)}

    def row(self) -> dict[str, Any]:
        return {"kind": "eval", "step": self.step, "loss": self.loss, "ppl": self.ppl, "name": self.name}


def perplexity(loss: float) -> float:
    """exp(loss); infinite where that overflows (and NaN stays NaN)."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def derive_eval(report: EvalReport) -> EvalMetrics:
    return EvalMetrics(step=report.step, loss=float(report.loss), ppl=perplexity(float(report.loss)), name=report.name)


def format_eval_line(m: EvalMetrics) -> str:
    """``[EVAL] step=N loss=... ppl=...``: the one formatter every backend's validation goes through."""
    line = f"[EVAL] step={m.step} loss={m.loss:.4f} ppl={m.ppl:.4f}"
    return line if m.name == "valid" else f"{line} set={m.name}"


def is_step_row(row: dict[str, Any]) -> bool:
    """metrics.jsonl holds one row per training step, validation passes (``"kind": "eval"``) and
    event rows (``{"event": kind, ...}``: a straggler report, a hang, a worker's end, the goodput);
    only step rows carry the training loss."""
    return "event" not in row and row.get("kind", "train") == "train"


def read_rows(path: Path, kind: str | None = "train") -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl of one ``kind`` (``train``, ``eval``; None: all), oldest first."""
    import json

    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if kind is None:
        return rows
    return [r for r in rows if is_step_row(r)] if kind == "train" else [r for r in rows if r.get("kind") == kind]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
        time=time.time(),
        sample_hash=report.sample_hash,
    )


def format_train_line(m: StepMetrics) -> str:
    """The seed's line, its fields in its order (``... samples_per_sec_per_gpu= mem=``), so a
    parser written for it keeps working; Primus' extras follow ``mem=``."""

    def num(value: float | None, fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    mfu = "n/a" if m.mfu is None else f"{100 * m.mfu:.2f}%"
    line = (
        f"[TRAIN] step={m.step} loss={m.loss:.4f} step_time={m.step_time:.3f}s "
        f"samples_per_sec={m.samples_per_sec:.2f} samples_per_sec_per_gpu={m.samples_per_sec_per_gpu:.2f} "
        f"mem={m.mem_gb:.2f}GB "
        f"tokens_per_sec={num(m.tokens_per_sec, '.1f')} tflops={num(m.tflops, '.4f')} mfu={mfu}"
    )
    if m.lr is not None:
        line += f" lr={m.lr:.4g}"
    if m.grad_norm is not None:
        line += f" grad_norm={m.grad_norm:.4f}"
    for key, value in m.extra.items():
        if _is_number(value):
            line += f" {key}={value:.4g}" if isinstance(value, float) and math.isfinite(value) else f" {key}={value}"
    return line
