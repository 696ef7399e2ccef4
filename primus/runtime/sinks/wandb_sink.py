"""Weights & Biases: one run per training run, the metrics.jsonl numbers at each step.

wandb is imported here only, when a run asked for it. Its console capture and banners are
off (``console="off"``, ``silent``): the console keeps Primus' lines, and wandb's own log
lands in ``{dir}/wandb/*/logs``. Offline runs are synced later with ``wandb sync DIR``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from primus.runtime.rundir import ExitCode
from primus.runtime.sinks.trackers import TrackerSink, WandbSettings

_EXIT_CODES = {"completed": ExitCode.COMPLETED, "preempted": ExitCode.PREEMPTED}


class WandbSink(TrackerSink):
    label = "W&B"

    def __init__(self, run, settings: WandbSettings):
        self.run, self.settings = run, settings

    @classmethod
    def start(cls, settings: WandbSettings, config: dict[str, Any]) -> "WandbSink":
        import wandb

        settings.dir.mkdir(parents=True, exist_ok=True)
        run = wandb.init(project=settings.project, name=settings.name, entity=settings.entity, dir=str(settings.dir),
                         mode=settings.mode, tags=settings.tags or None, config=config, reinit="create_new",
                         settings=wandb.Settings(console="off", silent=True))
        return cls(run, settings)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def finish(self, status: str) -> None:
        import wandb

        self.run.finish(exit_code=_EXIT_CODES.get(status, 1))
        wandb.teardown()  # finish() returns before wandb's service has written the run out: wait for it

    def describe(self) -> str:
        if self.run.offline:
            run_dir = Path(self.run.dir).parent  # run.dir is the run's files/ folder
            where = f"offline in {run_dir} (upload later: wandb sync {run_dir})"
        else:
            where = self.run.url or "online"
        return f"project {self.settings.project}, run {self.settings.name}: {where}"
