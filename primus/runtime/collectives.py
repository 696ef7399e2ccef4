"""A rank's exposed communication, and the collectives it entered, through torch's own seams.

- **Time blocked in communication.** Every blocking ``torch.distributed`` collective ends in
  ``Work.wait()`` called from Python (``distributed_c10d``: ``work = group.allreduce(...);
  work.wait()``), and so do asynchronous callers (FSDP2, Megatron's overlapped grad reduction);
  DTensor's functional collectives end in ``_functional_collectives.wait_tensor``. Those two are
  wrapped while a run trains (``instrumented``): the time the training thread spends in them is
  its "comm" phase (``primus.runtime.phases``). Nothing else of torch is touched, and the
  originals are back when the run ends.
- **The last collectives entered** are torch's flight recorder, which records every collective
  of every process group (gloo included in torch 2.13: op, group, sizes, sequence number, state)
  when ``TORCH_FR_BUFFER_SIZE`` > 0: ``enable_flight_recorder`` turns it on (unless the user or
  the engine set it: TorchTitan's ``comm.trace_buf_size`` wins), ``flight_record`` reads it.
- **``hang@rankR:stepS``** must stop a rank *before* it issues a collective (issued but never
  waited on, a gloo collective still completes): only when that fault is set are the
  ProcessGroup's collective methods wrapped too.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from primus.runtime.faults import hang_forever, hang_step
from primus.runtime.phases import PhaseClock

FLIGHT_RECORDER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")  # torch's names, newest first
DEFAULT_FLIGHT_RECORDER_ENTRIES = 2000
_ISSUING_METHODS = ("allreduce", "allreduce_coalesced", "allgather", "allgather_coalesced", "_allgather_base",
                    "all_gather_single", "allgather_into_tensor_coalesced", "reduce_scatter", "_reduce_scatter_base",
                    "reduce_scatter_single", "reduce_scatter_tensor_coalesced", "broadcast", "reduce", "gather",
                    "scatter", "alltoall", "alltoall_base", "all_to_all_single", "barrier", "send", "recv")


def enable_flight_recorder(entries: int = DEFAULT_FLIGHT_RECORDER_ENTRIES) -> None:
    """Before the process group exists: keep the last ``entries`` collectives of each rank."""
    if not any(os.environ.get(name) for name in FLIGHT_RECORDER_ENV):
        os.environ[FLIGHT_RECORDER_ENV[0]] = str(entries)


def flight_record() -> dict[str, Any] | None:
    """torch's flight recorder of this rank, as JSON data (None where it is off or unavailable)."""
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json

        return json.loads(_dump_fr_trace_json(includeCollectives=True, onlyActive=False))
    except Exception:  # an older torch, no process group, a recorder that is off
        return None


def _timed(clock: PhaseClock, original):
    def wait(*args: Any, **kwargs: Any) -> Any:
        clock.enter("comm")
        try:
            return original(*args, **kwargs)
        finally:
            clock.exit("comm")

    wait.__wrapped__ = original
    return wait


def _stop_before(clock: PhaseClock, rank: int, step: int, name: str, original):
    def issue(*args: Any, **kwargs: Any) -> Any:
        current = (clock.last_step or 0) + 1 if clock.in_step else None
        if current == step:
            hang_forever(rank, step, f"ProcessGroup.{name}")
        return original(*args, **kwargs)

    issue.__wrapped__ = original
    return issue


@contextmanager
def instrumented(clock: PhaseClock, rank: int, time_waits: bool = True) -> Iterator[None]:
    """While training: communication waits are timed into ``clock`` (``time_waits``: for the straggler
    report); a ``hang@`` fault is armed."""
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as funcol

    patched: list[tuple[Any, str, Any]] = []
    if time_waits:
        patched += [(dist.distributed_c10d.Work, "wait", dist.distributed_c10d.Work.wait),
                    (funcol, "wait_tensor", funcol.wait_tensor)]
    replacements = [_timed(clock, original) for _, _, original in patched]
    hang_at = hang_step(rank)
    if hang_at is not None:
        group_class = dist.ProcessGroup
        for name in _ISSUING_METHODS:
            if hasattr(group_class, name):
                original = getattr(group_class, name)
                patched.append((group_class, name, original))
                replacements.append(_stop_before(clock, rank, hang_at, name, original))
    for (owner, name, _), replacement in zip(patched, replacements):
        setattr(owner, name, replacement)
    try:
        yield
    finally:
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)
