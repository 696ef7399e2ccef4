"""Saving Megatron checkpoints without stalling training, and going on when a save fails.

``async_save`` (Megatron-LM's argument; ``ckpt_format: torch_dist``): megatron-core's
``dist_checkpointing.save`` returns the write as an ``AsyncRequest``, which a forked process (or,
with ``use_persistent_ckpt_worker``, one long-lived worker) carries out while training goes on; each
step polls it, and once every rank's write has finished its finalize step writes ``metadata.json``
and moves the tracker to the new iteration: Megatron-LM's ``schedule_async_save`` /
``maybe_finalize_async_save``. A new save, and the end of the run, first wait for the previous one.
On CPU (gloo) too: the CPU shims make megatron-core's CUDA synchronisation a no-op. The legacy and
``fsdp_dtensor`` formats have no async path in megatron-core: they save synchronously, said once.

A save that fails (a full disk, no permission) fails on every rank at the same point: megatron-core
raises a failed write on every rank, and what only rank 0 does (creating the directory, the tracker)
goes through ``agree``. Then the partial directory is removed, one WARNING names the cause and the
newest checkpoint, and training goes on; ``primus.checkpoint.fail_on_error: true`` stops the run instead.
"""
from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from primus.runtime.checkpoints import save_errors


class SaveFailed(RuntimeError):
    """A checkpoint save failed on at least one rank; raised on every rank."""


def agree(action: Callable[[], object] | None, what: str) -> None:
    """Run ``action`` here (None: nothing to do on this rank), then let every rank know whether any failed."""
    import torch.distributed as dist

    error = None
    if action is not None:
        try:
            action()
        except save_errors() as exc:  # any failure of a save step: every rank must hear of it
            error = f"{what}: {type(exc).__name__}: {exc}"
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    failed = [(rank, e) for rank, e in enumerate(errors) if e is not None]
    if failed:
        rank, first = failed[0]
        raise SaveFailed(f"rank {rank}: {first}" + (f" (and {len(failed) - 1} more rank(s))" if len(failed) > 1 else ""))


def _is_save_error(exc: BaseException) -> bool:
    from megatron.core.dist_checkpointing.core import CheckpointingException
    from torch.distributed.checkpoint.api import CheckpointException

    return isinstance(exc, (SaveFailed, OSError, CheckpointException, CheckpointingException))


class CheckpointSaver:
    """Megatron checkpoints of one run: synchronous or ``async_save``, and the failure policy."""

    def __init__(self, root: Path, args, model, optimizer, scheduler, ctx, *, fail_on_error: bool):
        self.root, self.args, self.ctx = Path(root), args, ctx
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.fail_on_error = fail_on_error
        self.queue = None
        self.pending: tuple[int, float] | None = None  # (iteration, when it was scheduled) of an async save
        if args.async_save:
            if args.ckpt_format == "torch_dist":
                from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

                self.queue = AsyncCallsQueue(persistent=args.use_persistent_ckpt_worker)
            else:
                ctx.log_derived("async_save", False, f"megatron-core writes ckpt_format {args.ckpt_format} synchronously "
                                "(its async path is dist_checkpointing's, ckpt_format: torch_dist)")

    def save(self, iteration: int, consumed_samples: int) -> None:
        from primus.backends.megatron.checkpoint import save_checkpoint

        self.wait()  # one save at a time, as Megatron-LM
        try:
            request = save_checkpoint(self.root, self.model, self.optimizer, self.scheduler, self.args,
                                      iteration=iteration, consumed_samples=consumed_samples,
                                      async_save=self.queue is not None)
        except save_errors() as exc:
            self._failed(iteration, exc)
            return
        if request is None:
            self.ctx.logger.info("saved checkpoint %s", self.root / f"iter_{iteration:07d}")
            return
        self.queue.schedule_async_request(request)
        self.pending = (iteration, time.perf_counter())
        self.ctx.logger.info("saving checkpoint %s in the background (async_save)", self.root / f"iter_{iteration:07d}")

    def poll(self, blocking: bool = False) -> None:
        """Finalize a background save that every rank has finished (call on every rank, every step)."""
        if self.pending is None:
            return
        iteration, started = self.pending
        try:
            done = self.queue.maybe_finalize_async_calls(blocking=blocking)
        except save_errors() as exc:
            self.pending = None
            self._failed(iteration, exc)
            return
        if done:
            self.pending = None
            self.ctx.logger.info("saved checkpoint %s (written in the background in %.1f s)",
                                 self.root / f"iter_{iteration:07d}", time.perf_counter() - started)

    def wait(self) -> None:
        self.poll(blocking=True)

    def close(self) -> None:
        """Stop megatron-core's writer. The normal ends wait for the last save first (``wait``); a save still
        pending here means the run is failing, when another rank may be gone: no collective, the write is
        abandoned (its directory never gets a tracker, so it is never resumed from)."""
        if self.queue is None:
            return
        if self.pending is not None:
            self.ctx.logger.warning("the background save of iteration %d was abandoned (the run is failing)",
                                    self.pending[0])
        self.queue.close(abort=self.pending is not None)

    def _failed(self, iteration: int, exc: BaseException) -> None:
        if not _is_save_error(exc):
            raise exc
        import torch.distributed as dist

        from primus.backends.megatron.checkpoint import iteration_dir, latest_iteration
        from primus.runtime.checkpoints import save_failed_warning, save_failure_cause

        cause = save_failure_cause(exc, self.root)
        if self.fail_on_error:
            raise SaveFailed(f"checkpoint at iteration {iteration} was not saved ({cause})") from exc
        partial, kept = iteration_dir(self.root, iteration), latest_iteration(self.root)
        removed = ""
        if dist.get_rank() == 0 and partial.exists() and kept != iteration:
            shutil.rmtree(partial, ignore_errors=True)
            removed = f"; removed the partial {partial}" if not partial.exists() else f"; could not remove {partial}"
        newest = f"the newest checkpoint is {iteration_dir(self.root, kept)}" if kept else "no checkpoint has been saved yet"
        self.ctx.logger.warning(save_failed_warning(f"iteration {iteration}", cause, removed, newest))
