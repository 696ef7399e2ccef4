"""Where a rank's time goes: exclusive wall time per phase, cheap enough to run on every step.

The backends' step hooks mark their phases (``with ctx.phases.phase("compute"):``); the waits
inside ``torch.distributed`` are marked "comm" by ``primus.runtime.collectives``. Time is
*exclusive*: a collective inside forward+backward counts as communication, not compute, so a
rank that waits for a slow peer shows a long "comm" and a normal "compute", and the slow rank a
long "compute" — that difference is what ``primus.runtime.stragglers`` compares across ranks.
Only the thread that created the clock (the training loop's) is timed: a background checkpoint
writer's collectives are not this rank's step.

Times are host (``perf_counter``) times. On a GPU the host runs ahead of the device and waits
at the step's synchronisation, so there the phases say where the *host* waited; the step time
and the data wait stay exact.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

PHASES = ("data", "compute", "comm", "optimizer", "checkpoint", "eval")
LABELS = {"data": "data wait", "compute": "forward+backward", "comm": "exposed communication",
          "optimizer": "optimizer", "checkpoint": "checkpoint", "eval": "evaluation"}
T = TypeVar("T")
STEP_PHASES = frozenset({"data", "compute", "optimizer"})  # entering one means a step is under way


class _Phase:
    """``with clock.phase(name):`` — one reusable object per name (no allocation per step)."""

    __slots__ = ("clock", "name")

    def __init__(self, clock: "PhaseClock", name: str):
        self.clock, self.name = clock, name

    def __enter__(self) -> None:
        self.clock.enter(self.name)

    def __exit__(self, *exc_info) -> None:
        self.clock.exit(self.name)


class PhaseClock:
    """Exclusive time per phase on one thread: ``window`` since the last ``take()``, ``total`` since
    the start. ``slow_factor`` (fault ``slow@rankR:xF``) stretches each forward+backward F-fold."""

    def __init__(self, *, slow_factor: float | None = None, now: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep):
        self._now, self._sleep = now, sleep
        self._thread = threading.get_ident()
        self.window = dict.fromkeys(PHASES, 0.0)
        self.total = dict.fromkeys(PHASES, 0.0)
        self._open: list[str] = []
        self._compute_at_entry: list[float] = []
        self._since = 0.0
        self._phases = {name: _Phase(self, name) for name in PHASES}
        self.slow_factor = slow_factor
        self.window_steps, self.window_step_time = 0, 0.0
        self.last_step: int | None = None  # the last step reported on this rank
        self.in_step = False  # a step phase was entered since that report

    def phase(self, name: str) -> _Phase:
        return self._phases[name]

    @property
    def current(self) -> str | None:
        """The innermost open phase (for a hang dump)."""
        return self._open[-1] if self._open else None

    def _charge(self, phase: str, seconds: float) -> None:
        self.window[phase] += seconds
        self.total[phase] += seconds

    def enter(self, phase: str) -> None:
        if threading.get_ident() != self._thread:
            return
        now = self._now()
        if self._open:
            self._charge(self._open[-1], now - self._since)
        self._open.append(phase)
        self._since = now
        if phase == "compute":
            self._compute_at_entry.append(self.total["compute"])
        if phase in STEP_PHASES:
            self.in_step = True

    def exit(self, phase: str) -> None:
        if threading.get_ident() != self._thread or phase not in self._open:
            return
        while self._open:  # an exception may have skipped inner exits: close them too
            top = self._open.pop()
            now = self._now()
            self._charge(top, now - self._since)
            self._since = now
            if top == "compute":
                self._stretch(self._compute_at_entry.pop())
            if top == phase:
                return

    def _stretch(self, compute_at_entry: float) -> None:
        if not self.slow_factor:
            return
        self._sleep((self.slow_factor - 1) * (self.total["compute"] - compute_at_entry))
        now = self._now()
        self._charge("compute", now - self._since)
        self._since = now

    def step_done(self, step: int, step_time: float) -> None:
        """A step was reported: it counts in the window; the next phase entered starts the next step."""
        self.window_steps += 1
        self.window_step_time += step_time
        self.last_step, self.in_step = step, False

    def take(self) -> tuple[int, float, dict[str, float]]:
        """(steps, their summed step time, exclusive seconds per phase) since the last take; resets."""
        taken = (self.window_steps, self.window_step_time, self.window)
        self.window = dict.fromkeys(PHASES, 0.0)
        self.window_steps, self.window_step_time = 0, 0.0
        return taken


def timed_iterator(iterable: Iterable[T], waiting: _Phase) -> Iterator[T]:
    """``iterable`` with each ``next`` timed as ``waiting`` (the data phase)."""
    iterator = iter(iterable)
    while True:
        with waiting:
            try:
                item = next(iterator)
            except StopIteration:
                return
        yield item
