"""Wan 2.2 text-to-video flow-matching training with AutoModel's ``TrainDiffusionRecipe``: what the
pretrain and finetune recipes share.

The module section mirrors AutoModel's diffusion YAML (model, step_scheduler, data, optimizer,
flow_matching, fsdp, checkpoint, ...). The plan takes out Primus's ``primus:`` block, derives what
Primus owns (``model.mode`` from the recipe, checkpoint dir, process-group backend), checks every key
against what AutoModel 0.7.0 reads, and the run hands a ``ConfigNode`` to ``TrainDiffusionRecipe``;
AutoModel owns FSDP2, data, optimizer and checkpoints. Each optimizer step is reported through
``RunContext.report_step``.
"""
from __future__ import annotations

import fcntl
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from primus.backends.nemo_automodel.config import EXPERTS, build_handoff
from primus.backends.nemo_automodel.plan import plan_inputs_if_known
from primus.config.errors import ConfigError
from primus.config.provenance import error_at, located
from primus.data.tiny_assets import built_by_prepare, tiny_assets_dir
from primus.plan.sizing import DIFFUSION
from primus.runtime.adapter import CheckpointSpec, EnginePlan, ModuleConfig, Recipe
from primus.runtime.preemption import Preempted

if TYPE_CHECKING:
    from primus.config.provenance import Provenance
    from primus.plan.diffusion import DiffusionLayout, WanSpec
    from primus.runtime.context import RunContext

DiffusionPlan = EnginePlan[dict, "WanSpec", "DiffusionLayout"]  # engine_config: AutoModel's config as a dict


class WanRecipe(Recipe):
    """A Wan 2.2 run of ``TrainDiffusionRecipe`` in one of AutoModel's modes (``model.mode``)."""

    patch_uses = frozenset({"diffusion"})

    mode: ClassVar[str]  # AutoModel's model.mode: pretrain (random init from pipeline_spec) | finetune
    weights: ClassVar[Callable[[dict, EnginePlan], None]]  # how the trained expert's weights come (config.py)

    def defaults(self) -> dict[str, Any]:
        return {
            "recipe": "TrainDiffusionRecipe",
            "seed": 42,
            "checkpoint": {"enabled": True, "model_save_format": "safetensors", "save_consolidated": False},
        }

    def plan(self, module: ModuleConfig, world_size: int | None, provenance: "Provenance | None" = None, *,
             run_dir: Path | None = None, device: str = "cpu") -> DiffusionPlan:
        """AutoModel's own config (the hand-off dict), every key checked against what 0.7.0 reads."""
        from primus.backends.nemo_automodel import schema

        self.adapter.require_installed()
        checkpoint_dir = (run_dir or Path(".")) / "checkpoints"
        plan: DiffusionPlan = EnginePlan(module, self, world_size, {}, CheckpointSpec(checkpoint_dir), sizing=DIFFUSION)

        def where(key: str) -> str:  # schema.check's prefix of each unknown key
            return f"{provenance.describe(f'{module.prefix}.{key}')}: " if provenance is not None else ""

        try:
            plan.engine_config = build_handoff(module.params, mode=self.mode, weights=self.weights,
                                               checkpoint_dir=checkpoint_dir,
                                               dist_backend="nccl" if device.startswith("cuda") else "gloo",
                                               plan=plan)
        except ConfigError as exc:
            raise located(exc, provenance, module.prefix) from None
        self.adapter.import_engine()
        schema.check(plan.engine_config, where)
        restore = plan.engine_config["checkpoint"].get("restore_from")
        if restore and restore != "LATEST":
            plan.checkpoint = CheckpointSpec(checkpoint_dir, load=str(restore))
        plan.model, plan.layout = plan_inputs_if_known(module.params, world_size)  # for plan / preflight
        return plan

    def prepare(self, plan: DiffusionPlan, log: Callable[[str], None]) -> list:
        root = tiny_assets_dir(plan.module.params)
        if root is not None:
            ensure_tiny_assets(root, log)
        return []

    def check_inputs(self, plan: DiffusionPlan, provenance: "Provenance | None" = None) -> None:
        cfg, prefix = plan.engine_config, plan.module.prefix
        checks = [("model.pretrained_model_name_or_path", cfg["model"]["pretrained_model_name_or_path"])]
        checks += [(f"data.{name}.cache_dir", loader["cache_dir"]) for name, loader in (cfg.get("data") or {}).items()
                   if isinstance(loader, dict) and loader.get("cache_dir")]
        for key, value in checks:
            if str(value).startswith((".", "/")) and not Path(value).exists() \
                    and not built_by_prepare(value, plan.module.params):
                raise error_at(provenance, f"{prefix}.{key}", f"{value} does not exist")

    def resume_problem(self, plan: DiffusionPlan, resuming: bool) -> str | None:
        """The model and optimizer reshard; the per-rank dataloader states do not (``resume.py``)."""
        from primus.backends.nemo_automodel.resume import data_position_problem

        return data_position_problem(plan.engine_config, "fsdp", plan.world_size, resuming)

    def run(self, plan: DiffusionPlan, ctx: "RunContext") -> None:
        from nemo_automodel.components.config.loader import ConfigNode
        from nemo_automodel.recipes.diffusion.train import TrainDiffusionRecipe

        from primus.backends.nemo_automodel.patches import ENGINE, PATCHES, check_version
        from primus.runtime.patches import Patcher, Where

        check_version(self.adapter.require_installed(), ctx.logger.warning)
        with Patcher(PATCHES, Where.here(self.patch_uses)) as patcher:  # undone when the run ends
            patcher.log(ctx.logger, ENGINE)
            self._train(TrainDiffusionRecipe, ConfigNode, plan, ctx)

    def _train(self, recipe_class: type, config_node: type, plan: DiffusionPlan, ctx: "RunContext") -> None:
        from primus.backends.nemo_automodel.hooks import StepTap

        plan.log_derived(ctx)
        cfg = plan.engine_config
        if ctx.resume and not cfg["checkpoint"].get("restore_from"):
            cfg["checkpoint"]["restore_from"] = "LATEST"
        check_fresh_checkpoint_dir(cfg, ctx)
        _log_expert(cfg, ctx.logger)
        recipe = recipe_class(config_node(cfg))
        recipe.setup()  # the patches keep Primus's logging; checkpoint loads on transient groups (CPU)
        _log_sigma_window(recipe, ctx.logger)
        tap = StepTap(recipe, ctx.report_step, ctx.should_stop, ctx.instruments.clock, ctx.samples)
        try:
            recipe.run_train_validation_loop()
        finally:
            tap.close()
        if getattr(recipe.step_scheduler, "sigterm_flag", False):
            # AutoModel's own distributed SIGTERM handler saved a checkpoint and ended the loop
            raise Preempted(int(recipe.step_scheduler.step), checkpointed=True)
        ctx.logger.info("nemo_automodel: %d optimizer steps, checkpoints in %s", len(tap.reports),
                        cfg["checkpoint"]["checkpoint_dir"])


def check_fresh_checkpoint_dir(cfg: dict[str, Any], ctx: "RunContext") -> None:
    """AutoModel silently resumes from any checkpoint it finds; without --resume that is a mistake."""
    if ctx.resume or cfg["checkpoint"].get("restore_from") or not cfg["checkpoint"].get("enabled", True):
        return
    from nemo_automodel.components.checkpoint.utils import find_latest_checkpoint

    latest = find_latest_checkpoint(cfg["checkpoint"]["checkpoint_dir"])
    if latest is not None:
        raise ConfigError(f"checkpoint '{latest}' already exists in this run dir: resume the run "
                          f"(--resume) or start a new one")


def _log_expert(cfg: dict[str, Any], log: logging.Logger) -> None:
    model = cfg["model"]
    mode = model["mode"]
    source = "random init from model.pipeline_spec" if mode == "pretrain" else "pretrained weights"
    expert = model.get("stage")
    if expert is None:
        log.info("nemo_automodel %s: single transformer, %s of %s", mode, source,
                 model["pretrained_model_name_or_path"])
    else:
        log.info("nemo_automodel %s: model.stage=%s trains expert '%s' (%s of %s)", mode, expert,
                 EXPERTS[str(expert).lower()], source, model["pretrained_model_name_or_path"])


def _log_sigma_window(recipe: Any, log: logging.Logger) -> None:
    if getattr(recipe, "stage", None) is None:
        return
    log.info("nemo_automodel: training '%s' on sigma in [%.4f, %.4f] (boundary_ratio=%.4f, %s)",
             recipe.active_transformer, recipe.sigma_min, recipe.sigma_max, recipe.boundary_ratio,
             "from config" if recipe.cfg.get("model.boundary_ratio") is not None else "from the pipeline")


def ensure_tiny_assets(root: Path, log: Callable[[str], None]) -> None:
    """Build the tiny random pipeline + latent cache once per ``root`` (concurrent launches: file lock)."""
    root.mkdir(parents=True, exist_ok=True)
    done = root / ".complete"
    if done.exists():
        return
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return
        from primus.data.diffusion.tiny import build_tiny_assets

        log(f"building the tiny Wan 2.2 pipeline and latent cache in {root} (primus.tiny_assets)")
        build_tiny_assets(root)
        done.write_text("ok\n")
