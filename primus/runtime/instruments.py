"""The instruments a rank carries while it trains, set up from the ``primus:`` block.

- a ``PhaseClock`` (always: the goodput's checkpoint and evaluation seconds come from it);
- the straggler report (``primus.stragglers``: every N steps, rank 0 compares the ranks);
- the watchdog (``primus.hang``), with torch's flight recorder on before the process group exists;
- the collective waits timed into the clock, for the length of the run (for the straggler report).

``RunContext`` hands the clock to the backends' step hooks and calls ``after_step`` for each step.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from primus.config.schema import PrimusOptions
from primus.runtime.faults import slow_factor
from primus.runtime.phases import PhaseClock
from primus.runtime.stragglers import StragglerReport
from primus.runtime.watchdog import Deadline, Watchdog


@dataclass
class Instruments:
    clock: PhaseClock
    stragglers: StragglerReport | None
    watchdog: Watchdog | None
    rank: int

    @classmethod
    def for_rank(cls, primus_opts: dict[str, Any], *, log_dir: Path, rank: int, world_size: int,
                 device: str) -> "Instruments":
        """``log_dir``: the module's log folder (``logs/{module}``), holding ``rank-{r}/``."""
        from primus.runtime.collectives import enable_flight_recorder

        options = PrimusOptions.model_validate(primus_opts)
        clock = PhaseClock(slow_factor=slow_factor(rank))
        stragglers = None
        if options.stragglers.enabled:
            stragglers = StragglerReport(clock, rank=rank, world_size=world_size, device=device,
                                         interval=options.stragglers.interval, threshold=options.stragglers.threshold)
        watchdog = None
        hang = options.hang
        if hang.enabled:
            if hang.flight_recorder_entries:
                enable_flight_recorder(hang.flight_recorder_entries)
            watchdog = Watchdog(clock, rank=rank, dump_dir=log_dir / f"rank-{rank}", verdict_dir=log_dir,
                                deadline=Deadline(hang.deadline_s, hang.factor, hang.floor_s), action=hang.action,
                                in_process="TORCHELASTIC_RUN_ID" not in os.environ)
        return cls(clock, stragglers, watchdog, rank)

    def after_step(self, step: int, step_time: float) -> list[dict[str, Any]]:
        """On every rank after each step: the events rank 0 writes to metrics.jsonl."""
        self.clock.step_done(step, step_time)
        if self.watchdog is not None:
            self.watchdog.beat(step_time)
        return self.stragglers.after_step(step) if self.stragglers is not None else []

    @contextmanager
    def running(self) -> Iterator[None]:
        from primus.runtime.collectives import instrumented

        if self.watchdog is not None:
            self.watchdog.start()
        try:
            with instrumented(self.clock, self.rank, time_waits=self.stragglers is not None):
                yield
        finally:
            if self.watchdog is not None:
                self.watchdog.stop()

    def worker_event(self, restart: int, started: float, ended: float) -> dict[str, Any]:
        """This worker group's record for the goodput (``primus.runtime.goodput``), written by rank 0."""
        return {"event": "worker", "restart": restart, "start": started, "end": ended,
                "checkpoint_s": round(self.clock.total["checkpoint"], 4), "eval_s": round(self.clock.total["eval"], 4)}
