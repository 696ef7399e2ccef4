"""Primus's step seam in ``TrainDiffusionRecipe``, whose loop returns nothing and has no callbacks.

  * ``torch.optim.Optimizer.register_step_post_hook`` on the last optimizer (torch's extension
    point) fires once per optimizer step, after the update: the micro-batch losses are averaged
    over all ranks there (one all-reduce; every rank steps its optimizer in lockstep), a
    ``StepReport`` goes out, and a stop request sets the step scheduler's own ``sigterm_flag``
    (AutoModel then checkpoints this step and ends the loop);
  * the micro-batch losses come from ``patches.tap_flow_matching_step`` — AutoModel offers no
    hook for them, so that one is a named patch.

step_time runs from the step's first forward to the end of its optimizer update, so it
excludes checkpoint saves and validation between steps. The same hooks mark the step's phases
(``primus.runtime.phases``): forward+backward from the first micro-batch to the optimizer's
pre-step hook, then the optimizer; saves and validation between steps.

With ``primus.sample_hashes`` each micro-batch's latents are digested as they arrive (``record_latents``).
"""
from __future__ import annotations

import time
from typing import Any, Callable

from primus.backends.nemo_automodel.patches import tap_flow_matching_step
from primus.runtime.metrics import StepReport
from primus.runtime.phases import PhaseClock

_BATCH_KEYS = ("video_latents", "image_latents", "latents", "text_embeddings")
_LATENT_KEYS = ("video_latents", "image_latents", "latents")


def _batch_size(batch: dict[str, Any]) -> int:
    for key in _BATCH_KEYS:
        value = batch.get(key)
        if value is not None and getattr(value, "ndim", 0) > 0:
            return int(value.shape[0])
    return 0


def record_latents(samples: Any, batch: dict[str, Any], dp_rank: int, dp_size: int) -> None:
    """A micro-batch's latents, one row per sample, into ``primus.sample_hashes``' digest. AutoModel's
    ``SequentialBucketSampler`` deals each bucket's shuffled order round-robin (rank r takes places
    r, r + dp, ...), so a row is keyed by its place in the step's dealt order."""
    latents = next((batch[key] for key in _LATENT_KEYS if getattr(batch.get(key), "ndim", 0) > 0), None)
    if latents is not None:
        samples.add(latents, group_rank=dp_rank, dealt_over=dp_size)


def time_saves_and_validation(recipe: Any, clock: PhaseClock) -> Callable[[], None]:
    """The recipe's ``save_checkpoint`` and ``_run_validation_epoch`` (both AutoModel recipes call them
    on ``self`` between steps) timed as the checkpoint and evaluation phases, on this recipe only;
    returns the undo."""
    names = {"save_checkpoint": "checkpoint", "_run_validation_epoch": "eval"}
    for name, phase in names.items():
        method, timing = getattr(recipe, name), clock.phase(phase)

        def timed(*args: Any, _method: Any = method, _timing: Any = timing, **kwargs: Any) -> Any:
            with _timing:
                return _method(*args, **kwargs)

        setattr(recipe, name, timed)
    return lambda: [recipe.__dict__.pop(name, None) for name in names]


class StepTap:
    """Attach to a set-up recipe; calls ``report(StepReport)`` on every rank, once per optimizer step."""

    def __init__(self, recipe: Any, report: Callable[[StepReport], Any], should_stop: Callable[[], bool] = lambda: False,
                 clock: PhaseClock | None = None, samples: Any = None):
        import torch

        self.recipe, self.report, self.should_stop, self.samples = recipe, report, should_stop, samples
        self.clock = clock or PhaseClock()
        self._losses: list[Any] = []
        self._samples = 0
        self._start: float | None = None
        self.reports: list[StepReport] = []
        self._dp_size = max(1, int(getattr(recipe, "dp_size", 1) or 1))
        self._world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        self._on_cuda = torch.device(getattr(recipe, "device", "cpu")).type == "cuda"
        if samples is not None:  # the data-parallel place the recipe's dataloader was built for
            self._data_rank, self._data_ranks = int(recipe._get_dp_rank()), int(recipe._get_dp_group_size())

        self._untap = tap_flow_matching_step(recipe.flow_matching_pipeline, self._on_micro_batch)
        self._handles = [recipe.optimizer[-1].register_step_pre_hook(self._before_optimizer_step),
                         recipe.optimizer[-1].register_step_post_hook(self._after_optimizer_step)]
        self._untime = time_saves_and_validation(recipe, self.clock)

    def _on_micro_batch(self, loss: Any, batch: dict[str, Any]) -> None:
        if self._start is None:
            self._start = time.perf_counter()
            self.clock.enter("compute")
        self._losses.append(loss.detach().float())
        self._samples += _batch_size(batch)
        if self.samples is not None:
            record_latents(self.samples, batch, self._data_rank, self._data_ranks)

    def _before_optimizer_step(self, optimizer, args, kwargs) -> None:
        self.clock.exit("compute")
        self.clock.enter("optimizer")

    def _after_optimizer_step(self, optimizer, args, kwargs) -> None:
        import torch
        import torch.distributed as dist

        self.clock.exit("optimizer")
        local_loss = float(torch.stack(self._losses).mean()) if self._losses else float("nan")
        if self._world > 1:
            totals = torch.tensor([local_loss, float(self._samples), 1.0], dtype=torch.float64,
                                  device=self.recipe.device if self._on_cuda else "cpu")  # NCCL: GPU tensors
            dist.all_reduce(totals)
            loss_sum, samples, ranks = totals.tolist()
        else:
            loss_sum, samples, ranks = local_loss, float(self._samples), 1.0
        if self._on_cuda:
            torch.cuda.synchronize()  # the step's kernels are done before its time is read
        elapsed = time.perf_counter() - (self._start or time.perf_counter())
        # tp/cp peers see the same samples: count each data-parallel replica once.
        global_samples = round(samples * self._dp_size / max(ranks, 1))
        report = StepReport(
            step=int(self.recipe.step_scheduler.step) + 1,  # the scheduler advances after this hook
            loss=loss_sum / ranks, step_time_s=elapsed, samples=global_samples,
            lr=float(optimizer.param_groups[0]["lr"]),
            extra={"micro_batches": len(self._losses)},
        )
        self._losses, self._samples, self._start = [], 0, None
        self.reports.append(report)
        self.report(report)
        if self.should_stop():
            # the step scheduler's own preemption path: checkpoint at this step, end the loop
            self.recipe.step_scheduler.sigterm_flag = True

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._untap()
        self._untime()
