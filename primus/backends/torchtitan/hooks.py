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
  and ``PrimusTrainer.should_continue_training`` end the loop after it.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

from torchtitan.components.checkpointer.dcp import CheckpointManager
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.trainer import Trainer

from primus.backends.torchtitan.steps import ExpertLoad, StepLoss, global_loss
from primus.runtime.metrics import EvalReport, StepReport


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


class PrimusCheckpointManager(CheckpointManager):
    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):
        pass

    save_now = False  # set when a stop was requested: checkpoint this step whatever the interval

    def _should_save(self, curr_step: int, last_step: bool = False) -> bool:
        return super()._should_save(curr_step, last_step or self.save_now)


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

    @property
    def tokens_per_step(self) -> int:
        training = self.config.training
        if training.global_batch_size > 0:
            return training.global_batch_size * training.seq_len
        dp = self.parallel_dims.dp_replicate * self.parallel_dims.dp_shard
        return training.local_batch_size * dp * training.seq_len

    def forward_backward_step(self, **kwargs: Any) -> Any:
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


def with_primus_components(cfg: Trainer.Config) -> PrimusTrainer.Config:
    """``cfg`` with Primus's trainer, metrics and (DCP) checkpoint components, settings unchanged."""
    cfg = _as(PrimusHFTrainer.Config if hasattr(cfg, "hf_model") else PrimusTrainer.Config, cfg)
    cfg.metrics = _as(PrimusMetricsProcessor.Config, cfg.metrics)
    if type(cfg.checkpoint) is CheckpointManager.Config:
        cfg.checkpoint = _as(PrimusCheckpointManager.Config, cfg.checkpoint)
    return cfg
