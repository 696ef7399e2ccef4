"""A TorchTitan checkpoint save that fails (a full disk, no permission): a WARNING, and training goes on.

DCP gathers every rank's write result and raises a failed save on every rank, synchronous or in the
background (``checkpoint.async_mode``, raised where TorchTitan waits for it), so every rank takes the
same decision here: remove the partial ``step-N`` (it has no ``.metadata``: nothing resumes from it),
say which checkpoint is the newest, and go on; ``primus.checkpoint.fail_on_error: true`` re-raises,
which ends the run as before (the launcher names the OS error).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any


def is_save_error(exc: BaseException) -> bool:
    from torch.distributed.checkpoint.api import CheckpointException

    return isinstance(exc, (OSError, CheckpointException))


class SaveFailures:
    def __init__(self, folder: str | Path, ctx: Any):
        self.folder, self.ctx = Path(folder), ctx

    def failed(self, step: int | None, exc: BaseException) -> None:
        """Re-raise ``exc`` when the run must stop; else clean up and warn (on every rank)."""
        if self.ctx.checkpoint_fail_on_error or not is_save_error(exc):
            raise exc
        import torch.distributed as dist

        from primus.runtime.checkpoints import checkpoints_in, save_failed_warning, save_failure_cause

        cause = save_failure_cause(exc, self.folder)
        partial = self.folder / f"step-{step}"
        removed = ""
        if (not dist.is_initialized() or dist.get_rank() == 0) and partial.is_dir() \
                and not (partial / ".metadata").exists():
            shutil.rmtree(partial, ignore_errors=True)
            removed = f"; removed the partial {partial}" if not partial.exists() else f"; could not remove {partial}"
        kept = [path for _, path in checkpoints_in(self.folder, "torchtitan") if (path / ".metadata").exists()]
        newest = f"the newest checkpoint is {kept[0]}" if kept else "no checkpoint has been saved yet"
        self.ctx.logger.warning(save_failed_warning(f"step {step}", cause, removed, newest))
