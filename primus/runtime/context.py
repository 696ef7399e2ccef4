"""What a backend gets from Primus on each rank: where to write, who it is, how to report."""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from primus.config.secrets import shown_value
from primus.runtime.faults import maybe_inject
from primus.runtime.instruments import Instruments
from primus.runtime.phases import PhaseClock
from primus.runtime.preemption import StopSignal
from primus.runtime.sample_hash import BatchDigest
from primus.runtime.metrics import EvalMetrics, EvalReport, StepMetrics, StepReport
from primus.runtime.reporter import MetricsReporter


class NonFiniteLoss(RuntimeError):
    """The global loss (or grad norm) of a step is NaN or infinite: the run stops before that state is saved."""

    def __init__(self, step: int, loss: float, what: str = "loss"):
        super().__init__(f"non-finite {what} ({loss}) at step {step}: stopped before saving a checkpoint of this "
                         "state (lower the learning rate, or check the data; Megatron-LM's "
                         "check_for_nan_in_loss_and_grad: false lets it continue)")
        self.step, self.loss = step, loss


@dataclass
class RunContext:
    run_dir: Path
    rank: int
    local_rank: int
    world_size: int
    device: str  # "cpu" or "cuda" (ROCm torch also says "cuda")
    logger: logging.Logger
    reporter: MetricsReporter
    resume: bool = False  # continue from the latest checkpoint under checkpoint_dir
    stop: StopSignal = field(default_factory=StopSignal)
    stop_on_non_finite_loss: bool = True  # a backend turns it off when the user asked to continue
    save_last_checkpoint: bool = True  # primus.save_last_checkpoint (AMD Primus: disable_last_saving)
    checkpoint_fail_on_error: bool = False  # primus.checkpoint.fail_on_error: a failed save stops the run
    samples: BatchDigest | None = None  # primus.sample_hashes: what this rank fed since the last step
    # the rank's phase clock, straggler report and watchdog (primus.runtime.instruments)
    instruments: Instruments = field(default_factory=lambda: Instruments(PhaseClock(), None, None, 0))

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1 or "TORCHELASTIC_RUN_ID" in os.environ

    @property
    def dist_backend(self) -> str:
        return "nccl" if self.device.startswith("cuda") else "gloo"

    def report_step(self, report: StepReport) -> StepMetrics:
        """Record one optimizer step; raises ``NonFiniteLoss`` (on every rank: the loss and the grad
        norm are global) before the engine can checkpoint a NaN state. The values decide, never an
        engine's message."""
        events = self.instruments.after_step(report.step, report.step_time_s)  # every rank: may gather
        if self.samples is not None and report.sample_hash is None:
            report.sample_hash = self.samples.finish()  # every rank: gathers the step's samples
        metrics = self.reporter.report(report)
        for event in events:
            self.reporter.event(event)
        maybe_inject(self.rank, report.step)
        if self.stop_on_non_finite_loss:
            if not math.isfinite(metrics.loss):
                raise NonFiniteLoss(report.step, metrics.loss)
            if metrics.grad_norm is not None and not math.isfinite(metrics.grad_norm):
                raise NonFiniteLoss(report.step, metrics.grad_norm, what="grad norm")
        return metrics

    def report_eval(self, report: EvalReport) -> EvalMetrics:
        """Record one validation pass (every rank calls it; rank 0's sinks write it)."""
        return self.reporter.report_eval(report)

    def phase(self, name: str):
        """``with ctx.phase("compute"):`` — where this rank's step time goes (``primus.runtime.phases``:
        data, compute, optimizer, checkpoint, eval; communication is timed by Primus itself)."""
        return self.instruments.clock.phase(name)

    def should_stop(self) -> bool:
        """Call at each step boundary: True (on all ranks) once SIGTERM asked for a graceful stop."""
        return self.stop.agreed(self.world_size)

    def log_derived(self, key: str, value: object, reason: str) -> None:
        """Settings the backend chose for the user are said once, never silently."""
        self.logger.info("derived %s=%s (%s)", key, shown_value(key, value), reason)
