"""What a backend gets from Primus on each rank: where to write, who it is, how to report."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from primus.runtime.faults import maybe_inject
from primus.runtime.preemption import StopSignal
from primus.runtime.metrics import MetricsReporter, StepMetrics, StepReport


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
        metrics = self.reporter.report(report)
        maybe_inject(self.rank, report.step)
        return metrics

    def should_stop(self) -> bool:
        """Call at each step boundary: True (on all ranks) once SIGTERM asked for a graceful stop."""
        return self.stop.agreed(self.world_size)

    def log_derived(self, key: str, value: object, reason: str) -> None:
        """Settings the backend chose for the user are said once, never silently."""
        self.logger.info("derived %s=%s (%s)", key, value, reason)
