"""Graceful stop on SIGTERM (what Slurm and Kubernetes send before killing a job).

The signal only sets a flag; the backend checks it at a step boundary, writes a checkpoint
and raises ``Preempted``. The job then exits with ``ExitCode.PREEMPTED`` (EX_TEMPFAIL, "try
again"; ``primus.runtime.rundir``), and the next ``primus train`` of the experiment resumes
from that checkpoint.
All ranks agree on stopping through one tiny all-reduce per step, so no rank is left
waiting in a collective that its peers will never enter.
"""
from __future__ import annotations

import os
import signal
import threading
from types import FrameType

class Preempted(Exception):
    def __init__(self, step: int, checkpointed: bool):
        super().__init__(f"stopped at step {step} on SIGTERM ({'checkpoint saved' if checkpointed else 'no checkpoint'})")
        self.step, self.checkpointed = step, checkpointed


class StopSignal:
    """Remembers that SIGTERM (or SIGUSR1, Slurm's --signal) arrived.

    A rank that does not reach a step boundary within ``grace_s`` (stuck in a collective with
    a dead peer, or still starting up) exits anyway, before the launcher's SIGKILL (30 s), so
    a graceful stop can never turn into a hang. Repeated signals (Slurm and srun and the node's
    launcher may each forward one) do not cut the grace short.
    """

    def __init__(self, grace_s: float | None = None) -> None:
        self.signal_name: str | None = None
        self.grace_s = grace_s if grace_s is not None else float(os.environ.get("PRIMUS_STOP_GRACE_S", "20"))

    def install(self) -> "StopSignal":
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signal_name is not None:
            return
        self.signal_name = signal.Signals(signum).name
        timer = threading.Timer(self.grace_s, os._exit, args=(128 + signum,))
        timer.daemon = True
        timer.start()

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def agreed(self, world_size: int) -> bool:
        """True on every rank as soon as any rank got the signal."""
        if world_size <= 1:
            return self.requested
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            return self.requested
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        flag = torch.tensor([1 if self.requested else 0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
