"""A watchdog on every rank: when no step completes within the deadline, say what this rank is doing.

The deadline is ``deadline_s`` when set, else ``factor`` × the median of the recent steps, at least
``floor_s``; it is armed by the first completed step (start-up has the engine's own timeouts),
and checkpoint saves and evaluation do not count against it. When it passes, the rank writes
into its log folder the Python stack of every thread (``hang-stacks.txt``) and ``hang.json``: its
last step, its phase and, per process group, the last collective it entered (torch's flight
recorder). The launcher's ``HangWatch`` (``primus.runtime.hangs``) reads every rank's dump and
names the rank the others wait for; then every rank exits non-zero (``action: exit``) — its
main thread may be blocked inside a collective for good, so the process ends from here — or
keeps waiting (``action: wait``).
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
import socket
import statistics
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from primus.runtime.hangs import DUMP, STACKS, VERDICT, summarise
from primus.runtime.phases import PhaseClock
from primus.runtime.rundir import ExitCode

VERDICT_WAIT_S = 15.0  # how long a rank waits for the launcher's verdict before it exits anyway
logger = logging.getLogger("primus.watchdog")


class HangDetected(RuntimeError):
    """No step completed within the deadline (raised into an in-process worker's main thread)."""


@dataclass(frozen=True)
class Deadline:
    fixed_s: float | None = None
    factor: float = 5.0
    floor_s: float = 60.0

    def seconds(self, step_times: list[float]) -> float:
        if self.fixed_s is not None:
            return self.fixed_s
        return max(self.floor_s, self.factor * statistics.median(step_times)) if step_times else self.floor_s


def thread_stacks() -> str:
    """Every thread's Python stack, named (what ``faulthandler`` prints, with thread names)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    main = threading.main_thread().ident
    parts = []
    for ident, frame in sorted(sys._current_frames().items(), key=lambda item: item[0] != main):
        parts.append(f"Thread {names.get(ident, '?')} ({ident}):\n{''.join(traceback.format_stack(frame))}")
    return "\n".join(parts)


def process_groups() -> dict[str, list[int]]:
    """The process groups this rank belongs to, by name, with their global ranks."""
    try:
        import torch.distributed as dist

        if not dist.is_initialized():
            return {}
        return {pg.group_name: sorted(dist.get_process_group_ranks(pg)) for pg in list(dist.distributed_c10d._world.pg_map)}
    except Exception:
        return {}


class Watchdog:
    def __init__(self, clock: PhaseClock, *, rank: int, dump_dir: Path, verdict_dir: Path, deadline: Deadline,
                 action: str = "exit", in_process: bool = False, poll_s: float = 1.0,
                 verdict_wait_s: float = VERDICT_WAIT_S):
        self.clock, self.rank, self.dump_dir, self.verdict_dir = clock, rank, dump_dir, verdict_dir
        self.verdict_wait_s = verdict_wait_s
        self.deadline, self.action, self.in_process = deadline, action, in_process
        self.poll_s = min(poll_s, (deadline.fixed_s or deadline.floor_s) / 10)
        self.step_times: deque[float] = deque(maxlen=50)
        self.last_progress: float | None = None  # monotonic; None until the first step completes
        self.main_thread = threading.get_ident()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="primus-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def beat(self, step_time: float) -> None:
        """A step completed (called on the training thread)."""
        self.step_times.append(step_time)
        self.last_progress = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self.last_progress is None:
                continue
            if self.clock.current in ("checkpoint", "eval"):
                self.last_progress = time.monotonic()  # a save or an evaluation is progress
                continue
            deadline = self.deadline.seconds(list(self.step_times))
            silent = time.monotonic() - self.last_progress
            if silent > deadline:
                self._fire(silent, deadline)
                return

    def _fire(self, silent: float, deadline: float) -> None:
        from primus.runtime.collectives import flight_record

        fired = time.time()
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        (self.dump_dir / STACKS).write_text(thread_stacks())
        record = flight_record()
        dump: dict[str, Any] = {
            "rank": self.rank, "host": socket.gethostname(), "pid": os.getpid(), "time": fired,
            "last_step": self.clock.last_step, "phase": self.clock.current, "silent_s": round(silent, 1),
            "deadline_s": round(deadline, 1), "flight_recorder": record is not None,
            "groups": summarise(record, process_groups()),
            "collectives": (record or {}).get("entries", [])[-32:]}
        path = self.dump_dir / DUMP
        tmp = path.with_name(f".{DUMP}.tmp")
        tmp.write_text(json.dumps(dump, indent=1, default=str))
        tmp.replace(path)  # whole, for the launcher that polls for it
        logger.info("watchdog: no step completed on rank %d for %.0f s (deadline %.0f s, after step %s): stacks and "
                    "last collectives written to %s", self.rank, silent, deadline, self.clock.last_step, self.dump_dir)
        if self.action == "wait":
            return
        self._await_verdict(fired)
        self._end(f"no step completed for {silent:.0f} s (deadline {deadline:.0f} s) after step {self.clock.last_step}")

    def _await_verdict(self, since: float) -> None:
        verdict = self.verdict_dir / VERDICT
        end = time.monotonic() + self.verdict_wait_s
        while time.monotonic() < end:
            try:
                if verdict.stat().st_mtime >= since - 1:
                    return
            except OSError:
                pass
            time.sleep(0.2)

    def _end(self, why: str) -> None:
        """Exit non-zero even with the main thread blocked in a collective. An in-process worker
        (one rank, no torchrun) gets ``HangDetected`` in its main thread first, so that its
        launcher records the end of the run; it is ended here if that does not happen."""
        error = HangDetected(f"rank {self.rank}: {why}")
        if self.in_process:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.main_thread), ctypes.py_object(HangDetected))
            if self._stop.wait(self.verdict_wait_s):
                return
        else:
            from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

            ErrorHandler().record_exception(error)  # the launcher's FAILED line names the cause
        logging.shutdown()
        os._exit(ExitCode.FAILED)  # the launcher's hang line says why
