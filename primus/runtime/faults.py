"""Deliberate failures for testing fault handling: ``PRIMUS_FAULT_INJECT=raise@rank1:step3``.

Kinds: ``raise`` (an exception in the trainer's step path), ``kill`` (SIGKILL of the rank),
``term`` (SIGTERM to the rank). Off unless the variable is set; checked once per step. A fault
is transient: it fires in the first worker attempt only, so a torchelastic restart recovers.
"""
from __future__ import annotations

import os
import re
import signal

_SPEC = re.compile(r"^(raise|kill|term)@rank(\d+):step(\d+)$")


class InjectedFault(RuntimeError):
    pass


def maybe_inject(rank: int, step: int) -> None:
    spec = os.environ.get("PRIMUS_FAULT_INJECT")
    if not spec:
        return
    match = _SPEC.match(spec.strip())
    if not match:
        raise ValueError(f"PRIMUS_FAULT_INJECT={spec!r}: expected KIND@rankR:stepS with KIND raise|kill|term")
    kind, fault_rank, fault_step = match.group(1), int(match.group(2)), int(match.group(3))
    if rank != fault_rank or step != fault_step or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    if kind == "raise":
        raise InjectedFault(f"injected failure on rank {rank} at step {step} (PRIMUS_FAULT_INJECT)")
    os.kill(os.getpid(), signal.SIGKILL if kind == "kill" else signal.SIGTERM)
