"""Name the slow rank: every N steps rank 0 gathers each rank's phase times and compares them.

In synchronous training every rank's *step* takes as long as the slowest rank's — the others wait
for it inside a collective. What differs is where the time went (``primus.runtime.phases``): the
slow rank spends it in a busy phase (data wait, forward+backward, optimizer, checkpoint), the
others in exposed communication. So each rank's busy phases are compared with the median of the
*other* ranks (rank 0's checkpoint time aside: it writes the save's metadata for everyone) (with two ranks, the plain median would be the pair's mean), and a rank at least
``threshold`` slower in one of them — by a margin worth naming, ``MIN_SHARE`` of a step — gets
one WARNING line (``straggler: rank R (host) PHASE 1.43× median over steps A–B``) and an event in
metrics.jsonl; every report also writes the per-rank figures (an event ``ranks``: the run's
per-rank heat map). The first step of each worker (lazy initialisation, compilation) is left out.

The exchange is one small all-gather (a few floats per rank) every N steps, at a step boundary
that every rank reaches anyway: the engines synchronise each step already (and Primus's stop
flag is one all-reduce per step), so it adds no new wait. Writing per-rank files for rank 0 to
poll would put hundreds of ranks on a shared filesystem and let rank 0 read stale windows.
Megatron-LM's ``StragglerDetector`` likewise gathers per-rank timings at its log interval.
"""
from __future__ import annotations

import logging
import socket
import statistics
from dataclasses import dataclass
from typing import Any

from primus.runtime.phases import LABELS, PHASES, PhaseClock

COMPARED = ("data", "compute", "optimizer", "checkpoint")  # busy phases: being slow there makes others wait
COORDINATED = frozenset({"checkpoint"})  # rank 0 writes a save's metadata: slower by design, so not compared
# The optimizer phase ends in collectives (the gradient norm, the distributed optimizer's gather) whose
# waits torch can issue from C++ (a DTensor's AsyncCollectiveTensor), out of reach of the comm timing:
# a healthy rank that waits there for a peer slow in data or forward+backward looks slow in "optimizer".
WAITS_FOR = {"optimizer": frozenset({"data", "compute"})}
MIN_SHARE = 0.05  # an excess under 5% of the median step is noise, never named
MAX_LINES = 8  # per report: a broken fleet is not a thousand warnings
logger = logging.getLogger("primus.stragglers")


@dataclass(frozen=True)
class Straggler:
    rank: int
    host: str
    phase: str
    ratio: float
    first_step: int
    last_step: int

    @property
    def line(self) -> str:
        return (f"straggler: rank {self.rank} ({self.host}) {LABELS[self.phase]} {self.ratio:.2f}× median "
                f"over steps {self.first_step}–{self.last_step}")

    def event(self) -> dict[str, Any]:
        return {"event": "straggler", "rank": self.rank, "host": self.host, "phase": self.phase,
                "ratio": round(self.ratio, 4), "steps": [self.first_step, self.last_step], "line": self.line}


def find_stragglers(per_step: list[dict[str, float]], threshold: float) -> list[tuple[int, str, float]]:
    """(rank, phase, ratio to the other ranks' median) for each rank slower than ``1 + threshold``
    times that median in a busy phase, its worst phase only; ``per_step`` holds each rank's mean
    seconds per step by phase (and ``step``). A rank slow only in the optimizer while another is slow
    in data or forward+backward is waiting for that one, so is not named. Slowest first."""
    margin = MIN_SHARE * statistics.median(figures["step"] for figures in per_step) if per_step else 0.0
    if len(per_step) < 2 or margin <= 0:  # one rank, or no step timed in the window
        return []
    slow: dict[int, dict[str, float]] = {}  # rank -> {phase: ratio} of each phase it is slow in
    for rank, figures in enumerate(per_step):
        for phase in COMPARED:
            skip = {rank, 0} if phase in COORDINATED else {rank}
            others = [other[phase] for index, other in enumerate(per_step) if index not in skip]
            if (phase in COORDINATED and rank == 0) or not others:
                continue
            median = statistics.median(others)
            if figures[phase] - median >= margin and figures[phase] >= (1 + threshold) * median:
                slow.setdefault(rank, {})[phase] = figures[phase] / max(median, margin)  # others near 0: the margin
    causes = {phase for phases in slow.values() for phase in phases}
    found = []
    for rank, phases in slow.items():
        if all(causes & WAITS_FOR.get(phase, frozenset()) for phase in phases):
            continue  # slow only where it waits for a rank that is slow elsewhere
        worst = max(phases, key=phases.__getitem__)
        found.append((rank, worst, phases[worst]))
    return sorted(found, key=lambda item: -item[2])


class StragglerReport:
    """Called by every rank after each reported step; every ``interval`` steps it gathers and rank 0
    judges. Returns the metrics.jsonl events to write (rank 0; [] elsewhere)."""

    def __init__(self, clock: PhaseClock, *, rank: int, world_size: int, device: str, interval: int,
                 threshold: float):
        self.clock, self.rank, self.world_size, self.device = clock, rank, world_size, device
        self.interval, self.threshold = interval, threshold
        self.hosts: list[str] | None = None
        self.first_step: int | None = None  # of the current window
        self.warm = False

    def after_step(self, step: int) -> list[dict[str, Any]]:
        if not self.warm:  # this process's first step (lazy initialisation, compilation) is not compared
            self.warm = True
            self.clock.take()
            return []
        if self.first_step is None:
            self.first_step = step
        if self.world_size < 2 or step % self.interval:
            return []
        first, self.first_step = self.first_step, None
        steps, step_time, seconds = self.clock.take()
        per_step = self._gather([step_time / max(steps, 1), *(seconds[p] / max(steps, 1) for p in PHASES)])
        if self.rank != 0 or per_step is None:
            return []
        return self._judge(per_step, first, step)

    def _gather(self, figures: list[float]) -> list[dict[str, float]] | None:
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            return None
        if self.hosts is None:  # once: where each rank runs, for the line
            self.hosts = [""] * self.world_size
            dist.all_gather_object(self.hosts, socket.gethostname())
        device = "cuda" if "nccl" in str(dist.get_backend()) else "cpu"
        mine = torch.tensor(figures, dtype=torch.float64, device=device)
        everyone = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(everyone, mine)
        keys = ("step", *PHASES)
        return [dict(zip(keys, row.tolist())) for row in everyone]

    def _judge(self, per_step: list[dict[str, float]], first: int, last: int) -> list[dict[str, Any]]:
        hosts = self.hosts or [""] * len(per_step)
        events: list[dict[str, Any]] = [{
            "event": "ranks", "steps": [first, last], "hosts": hosts,
            **{("step_time" if key == "step" else key): [round(f[key], 6) for f in per_step]
               for key in ("step", *PHASES)}}]
        found = find_stragglers(per_step, self.threshold)
        for rank, phase, ratio in found[:MAX_LINES]:
            straggler = Straggler(rank, hosts[rank], phase, ratio, first, last)
            logger.warning(straggler.line)
            events.append(straggler.event())
        if len(found) > MAX_LINES:
            logger.warning("straggler: %d more ranks slower than %.0f%% over the median (all in the metrics)",
                           len(found) - MAX_LINES, 100 * self.threshold)
            events += [Straggler(r, hosts[r], p, x, first, last).event() for r, p, x in found[MAX_LINES:]]
        return events
