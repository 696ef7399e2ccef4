"""AMD Primus's NeMo AutoModel spellings -> what AutoModel 0.7.0's diffusion recipe reads.

``optim.*`` is the diffusion YAML schema AutoModel itself retired; 0.7.0 refuses it with the
mapping in ``nemo_automodel/recipes/diffusion/train.py::_REMOVED_KEY_MIGRATIONS``, which is
applied here instead. ``model.mode`` picks the stage (Primus derives ``model.mode`` from it).
"""
from __future__ import annotations

from typing import Any

from primus.compat import differs
from primus.compat.rules import custom, rename, switch, table

MIGRATION = "AutoModel's own migration (_REMOVED_KEY_MIGRATIONS, 0.7.0)"
STAGES = {"pretrain": "pretrain", "finetune": "finetune"}


def _mode(value: Any, ctx, key: str) -> None:
    stage = STAGES.get(str(value))
    if stage is None:
        raise ctx.fail(key, f"'{value}' is not one of {', '.join(STAGES)}")
    if ctx.stage_explicit and ctx.stage not in (stage, "train" if stage == "pretrain" else stage):
        raise ctx.fail(key, f"model.mode: {value} contradicts the module's stage '{ctx.stage}' set in the "
                            f"experiment: keep one")
    ctx.set_stage(key, value, stage, "AMD Primus's model.mode picks the stage; Primus sets model.mode from it")


def _wandb(value: Any, ctx, key: str) -> None:
    """AMD's ``wandb.enable``: 0.7.0 builds a W&B run for any ``wandb:`` block, so off drops the block."""
    section = ctx.params.get("wandb")
    try:
        on = switch(value)
    except ValueError as exc:
        raise ctx.fail(key, str(exc)) from None
    if on:
        ctx.note(key, value, "W&B on: the rest of the wandb: block goes to wandb.init")
        return
    ctx.params.pop("wandb", None)
    ctx.note(key, value, f"W&B off: the wandb: block {section or {}} is dropped (AutoModel 0.7.0 starts W&B "
                         f"for any wandb: block)")


RUN_DIR = "{run dir}/checkpoints"


def _checkpoint_dir(value: Any, ctx, key: str) -> None:
    """AutoModel's own key, kept (the backend puts the run dir there, a ``derived`` line). In AMD Primus's format
    a checkpoint AMD would write to ``value`` is written to the run dir: a ``differs:`` line; with checkpoints off
    nothing is written, and nothing is said."""
    ctx.params.setdefault("checkpoint", {})["checkpoint_dir"] = value
    enabled = ctx.get("checkpoint.enabled", True)
    if ctx.amd_format and value is not None and (enabled is True or str(enabled).lower() == "true"):
        differs.record(ctx, key, value, key, RUN_DIR, "Primus keeps a run's checkpoints in its run dir: "
                       "{workspace}/{work_group}/{user_name}/{exp_name}/checkpoints")


RULES = table(
    custom("model.mode", "the stage", _mode),
    rename("optim.learning_rate", "optimizer.lr", MIGRATION),
    rename("optim.optimizer.*", "optimizer.*", MIGRATION),
    rename("optim.clip_grad", "clip_grad_norm.max_norm", MIGRATION),
    rename("step_scheduler.log_every", "step_scheduler.log_remote_every_steps", MIGRATION),
    custom("wandb.enable", "AMD Primus's W&B switch", _wandb),
    custom("checkpoint.checkpoint_dir", "where checkpoints go", _checkpoint_dir),
)
