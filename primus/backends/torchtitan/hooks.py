"""Primus's step seam wired into TorchTitan through TorchTitan's own extension points.

TorchTitan builds every component from a ``Configurable.Config`` whose ``_owner`` is the class to
construct, and its own experiments subclass ``Trainer``, ``MetricsProcessor`` and the checkpoint
managers (the managers document ``_should_save`` as the hook to override). So:

- ``PrimusMetricsProcessor.log`` keeps the step's global loss, grad norm and LR, and its
  ``log_validation`` hands each validation loss to ``RunContext.report_eval``;
- ``PrimusTrainer.train_step`` times the step and reports it (``RunContext.report_step``), with the
  loss of the last pipeline stage and the MoE load balance made uniform, and
  ``PrimusTrainer.forward_backward_step`` stops on a non-finite step loss before the update, read
  from the values as every backend does (``steps.py``);
- a stop request (SIGTERM) makes ``PrimusCheckpointManager`` save this step whatever the interval,
  and ``PrimusTrainer.should_continue_training`` end the loop after it;
- the step's phases (``RunContext.phase``: data wait, forward+backward, optimizer, checkpoint,
  evaluation) are marked around TorchTitan's own ``batch_generator``, ``forward_backward_step``,
  optimizer ``step``, checkpoint ``_save`` and ``validate`` (``time_phases``);
- a save that fails (``checkpoint_failures.py``), at once or in the background (``async_mode``), is a
  WARNING and training goes on, unless ``primus.checkpoint.fail_on_error``.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from torchtitan.components.checkpointer.base import MODEL
from torchtitan.components.checkpointer.dcp import CheckpointManager
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.trainer import Trainer

from primus.backends.torchtitan.checkpoint_failures import SaveFailures
from primus.backends.torchtitan.data import dealt_over
from primus.backends.torchtitan.steps import ExpertLoad, StepLoss, batch_rank, global_loss
from primus.runtime.checkpoints import check_model_matches, gathered, save_errors
from primus.runtime.metrics import EvalReport, StepReport
from primus.runtime.phases import timed_iterator


def _as(config_cls: type, config: Any) -> Any:
    """The same settings in a subclass's Config (so that ``build()`` constructs the subclass)."""
    return config_cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init})


class PrimusMetricsProcessor(MetricsProcessor):
    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        pass

    primus_ctx: Any = None  # the RunContext, set by PrimusTrainer.attach

    def log_validation(self, loss: float, step: int, extra_metrics: dict[str, Any] | None = None) -> None:
        """TorchTitan's validator hands its global loss here: Primus records it like a step."""
        if self.primus_ctx is not None:
            self.primus_ctx.report_eval(EvalReport(step=step, loss=float(loss)))
        super().log_validation(loss, step, extra_metrics)

    def log(self, step: int, global_avg_loss: float, global_max_loss: float, grad_norm: float,
            extra_metrics: dict[str, Any] | None = None) -> None:
        extra = extra_metrics or {}
        self.primus_step = {"loss": float(global_avg_loss), "grad_norm": float(grad_norm),
                            "lr": next((v for k, v in extra.items() if k.startswith("lr")), None)}
        super().log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra_metrics)


def check_torchtitan_checkpoint(path, states: dict[str, Any]) -> None:
    """The checkpoint's model tensors (its keys without the optimizer's, dataloader's, ... prefixes)
    against the model's flattened state dict, as TorchTitan saves it (global shapes, every rank's)."""
    model = gathered({key: tuple(value.shape) for key, value in states[MODEL].state_dict().items()
                      if hasattr(value, "shape")})
    others = tuple(f"{name}." for name in states if name != MODEL) + tuple(name for name in states if name != MODEL)
    check_model_matches(path, model, lambda key: not key.startswith(others))


class PrimusCheckpointManager(CheckpointManager):
    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):
        pass

    save_now = False  # set when a stop was requested: checkpoint this step whatever the interval
    failures: SaveFailures | None = None  # Primus's policy for a failed save (set by PrimusTrainer.attach)
    background_step: int | None = None  # the step an async save in flight is writing
    timing: Any = nullcontext()  # the "checkpoint" phase, once attached to a run

    def _should_save(self, curr_step: int, last_step: bool = False) -> bool:
        return super()._should_save(curr_step, last_step or self.save_now)

    def _save(self, curr_step: int, last_step: bool = False) -> bool:
        with self.timing:
            try:
                saved = super()._save(curr_step, last_step)
            except save_errors() as exc:  # DCP raises a failed write on every rank
                if self.failures is None:
                    raise
                self.failures.failed(curr_step, exc)
                return False
        if saved and self.save_future is not None:
            self.background_step = curr_step
        return saved

    def _wait_for_saving(self) -> None:
        try:
            super()._wait_for_saving()
        except save_errors() as exc:  # the background write failed (async_mode)
            self.save_future = None
            if self.failures is None:
                raise
            self.failures.failed(self.background_step, exc)

    def _load(self, step: int = -1) -> bool:
        """Before DCP loads a checkpoint of this run (which would silently take the tensors the model
        asks for and ignore the others): its model tensors must be exactly the model's."""
        from pathlib import Path

        if os.path.isdir(self.folder):
            load_step = self._find_load_step() if step == -1 else step
            path = Path(self._create_checkpoint_id(load_step)) if load_step != -1 else None
            if path is not None and (path / ".metadata").is_file() and MODEL in self.states:
                check_torchtitan_checkpoint(path, self.states)
        return super()._load(step)


class PrimusTrainer(Trainer):
    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        pass

    ctx: Any = None
    flops_per_token: float | None = None
    stopping = False
    step_start = 0.0  # when the current train_step began (perf_counter)

    def attach(self, ctx: Any, flops_per_token: float | None) -> None:
        self.ctx, self.flops_per_token = ctx, flops_per_token
        self.expert_load = ExpertLoad(self.model_parts)
        self.step_loss = StepLoss(self)
        if isinstance(self.metrics_processor, PrimusMetricsProcessor):
            self.metrics_processor.primus_ctx = ctx
        if isinstance(self.checkpointer, PrimusCheckpointManager) and self.checkpointer.enable:
            self.checkpointer.failures = SaveFailures(self.checkpointer.folder, ctx)
        time_phases(self, ctx)

    def batch_generator(self, data_iterable: Any) -> Any:
        batches = timed_iterator(super().batch_generator(data_iterable), self.ctx.phase("data"))
        if self.ctx.samples is None:
            return batches
        return self.ctx.samples.recorded(batches, rows=lambda batch: batch[0]["input"], group_rank=batch_rank(self),
                                         dealt_over=dealt_over(self.dataloader))

    @property
    def tokens_per_step(self) -> int:
        training = self.config.training
        if training.global_batch_size > 0:
            return training.global_batch_size * training.seq_len
        dp = self.parallel_dims.dp_replicate * self.parallel_dims.dp_shard
        return training.local_batch_size * dp * training.seq_len

    def forward_backward_step(self, **kwargs: Any) -> Any:
        with self.ctx.phase("compute"):
            loss = super().forward_backward_step(**kwargs)
        if self.ctx is not None and self.ctx.stop_on_non_finite_loss:
            value = self.step_loss.add(loss)
            if value is not None and not math.isfinite(value):  # the step is recorded, then NonFiniteLoss
                tokens = self.tokens_per_step
                self.ctx.report_step(StepReport(step=self.step, loss=value, samples=tokens // self.config.training.seq_len,
                                                step_time_s=time.perf_counter() - self.step_start, tokens=tokens))
        return loss

    def train_step(self, *args: Any, **kwargs: Any) -> Any:
        start = self.step_start = time.perf_counter()
        tokens = self.tokens_per_step
        samples = tokens // self.config.training.seq_len
        result = super().train_step(*args, **kwargs)
        elapsed = time.perf_counter() - start
        step = getattr(self.metrics_processor, "primus_step", None)
        if step is not None:
            self.metrics_processor.primus_step = None
            self.ctx.report_step(StepReport(
                step=self.step, loss=global_loss(self, step["loss"]), step_time_s=elapsed,
                samples=samples, tokens=tokens,
                flops=self.flops_per_token * tokens if self.flops_per_token else None,
                lr=step["lr"], grad_norm=step["grad_norm"], extra=self.expert_load.extra()))
        if self.step < self.config.training.steps and self.ctx.should_stop():
            self.stopping = True
            if isinstance(self.checkpointer, PrimusCheckpointManager):
                self.checkpointer.save_now = True
        return result

    def should_continue_training(self) -> bool:
        return not self.stopping and super().should_continue_training()


class PrimusHFTrainer(PrimusTrainer):
    """For a transformers-backend model (Llama 4): ``hf_model`` is where the backend's model config reads the
    Hugging Face config.json (``TransformersBackendConfig.hf_model``). TorchTitan's ``HFTransformerTrainer``
    only adds context-parallel mask handling, which Primus refuses for these models (``llama4.py``)."""

    @dataclass(kw_only=True, slots=True)
    class Config(PrimusTrainer.Config):
        hf_model: str = ""


def _timed(method: Any, phase: Any) -> Any:
    def timed(*args: Any, **kwargs: Any) -> Any:
        with phase:
            return method(*args, **kwargs)

    return timed


def time_phases(trainer: PrimusTrainer, ctx: Any) -> None:
    """The phases outside ``train_step``'s own overrides, on this trainer's components only."""
    trainer.optimizers.step = _timed(trainer.optimizers.step, ctx.phase("optimizer"))
    if isinstance(trainer.checkpointer, PrimusCheckpointManager):
        trainer.checkpointer.timing = ctx.phase("checkpoint")
    if getattr(trainer, "validator", None) is not None and hasattr(trainer.validator, "validate"):
        trainer.validator.validate = _timed(trainer.validator.validate, ctx.phase("eval"))


def with_primus_components(cfg: Trainer.Config) -> PrimusTrainer.Config:
    """``cfg`` with Primus's trainer, metrics and (DCP) checkpoint components, settings unchanged."""
    cfg = _as(PrimusHFTrainer.Config if hasattr(cfg, "hf_model") else PrimusTrainer.Config, cfg)
    cfg.metrics = _as(PrimusMetricsProcessor.Config, cfg.metrics)
    if type(cfg.checkpoint) is CheckpointManager.Config:
        cfg.checkpoint = _as(PrimusCheckpointManager.Config, cfg.checkpoint)
    return cfg
