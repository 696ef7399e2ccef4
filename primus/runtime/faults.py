"""Deliberate failures for testing fault handling: ``PRIMUS_FAULT_INJECT=raise@rank1:step3``.

Kinds (several may be given, separated by commas):

- ``raise@rankR:stepS`` an exception in the trainer's step path, ``kill@rankR:stepS`` SIGKILL of
  the rank, ``term@rankR:stepS`` SIGTERM to the rank: once step S has been reported;
- ``slow@rankR:xF``: from the first step on, rank R's steps take F times as long — a sleep inside
  the forward+backward phase, as a slow device or a throttled host would make it
  (``primus.runtime.phases``);
- ``hang@rankR:stepS``: during step S, rank R stops before its next collective and never returns,
  as a rank stuck outside a collective leaves its peers waiting inside it
  (``primus.runtime.collectives``).

Off unless the variable is set. A fault is transient: it fires in the first worker attempt only,
so a torchelastic restart recovers.
"""
from __future__ import annotations

import logging
import os
import re
import signal
import time
from dataclasses import dataclass

_SPEC = re.compile(r"^(?:(raise|kill|term|hang)@rank(\d+):step(\d+)|(slow)@rank(\d+):x(\d+(?:\.\d+)?))$")
_KINDS = "KIND@rankR:stepS with KIND raise|kill|term|hang, or slow@rankR:xF"


class InjectedFault(RuntimeError):
    pass


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    step: int = 0  # raise, kill, term, hang
    factor: float = 1.0  # slow


def parse(spec: str) -> list[Fault]:
    faults = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        match = _SPEC.match(part)
        if not match:
            raise ValueError(f"PRIMUS_FAULT_INJECT={spec!r}: expected {_KINDS}")
        if match.group(4):
            factor = float(match.group(6))
            if factor < 1:
                raise ValueError(f"PRIMUS_FAULT_INJECT={spec!r}: slow@rankR:xF needs F >= 1")
            faults.append(Fault("slow", int(match.group(5)), factor=factor))
        else:
            faults.append(Fault(match.group(1), int(match.group(2)), step=int(match.group(3))))
    return faults


def _active(rank: int, kind: str) -> Fault | None:
    spec = os.environ.get("PRIMUS_FAULT_INJECT")
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return None
    return next((f for f in parse(spec) if f.kind == kind and f.rank == rank), None)


def maybe_inject(rank: int, step: int) -> None:
    """The step-boundary faults (raise, kill, term), checked after each reported step."""
    spec = os.environ.get("PRIMUS_FAULT_INJECT")
    if not spec:
        return
    for fault in parse(spec):
        if fault.kind not in ("raise", "kill", "term") or fault.rank != rank or fault.step != step:
            continue
        if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
            return
        if fault.kind == "raise":
            raise InjectedFault(f"injected failure on rank {rank} at step {step} (PRIMUS_FAULT_INJECT)")
        os.kill(os.getpid(), signal.SIGKILL if fault.kind == "kill" else signal.SIGTERM)


def slow_factor(rank: int) -> float | None:
    """F of ``slow@rankR:xF`` for this rank, else None."""
    fault = _active(rank, "slow")
    return fault.factor if fault is not None and fault.factor > 1 else None


def hang_step(rank: int) -> int | None:
    """S of ``hang@rankR:stepS`` for this rank, else None."""
    fault = _active(rank, "hang")
    return fault.step if fault is not None else None


def hang_forever(rank: int, step: int, op: str) -> None:
    """Never return: what a rank stuck before a collective looks like to its peers (and to a
    stack dump: this function is on top of the rank's main thread)."""
    logging.getLogger("primus.faults").warning("injected hang on rank %d at step %d before %s (PRIMUS_FAULT_INJECT)",
                                               rank, step, op)
    while True:
        time.sleep(1)
