"""NeMo AutoModel backend: Wan 2.2 text-to-video flow-matching training.

The module section mirrors AutoModel's diffusion YAML (model, step_scheduler, data, optimizer,
flow_matching, fsdp, checkpoint, ...). Primus strips its own keys, derives what it owns (mode
from the stage, checkpoint dir, resume point, process-group backend), checks every key against
what AutoModel 0.7.0 reads, and hands a ``ConfigNode`` to ``TrainDiffusionRecipe``; AutoModel
owns FSDP2, data, optimizer and checkpoints. Each optimizer step is reported through
``RunContext.report_step``.
"""
from __future__ import annotations

import fcntl
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from primus.backends.nemo_automodel.config import EXPERTS, Handoff, build_handoff, expand_path, tiny_assets_of
from primus.config.errors import ConfigError
from primus.runtime.adapter import BackendAdapter, ModuleConfig
from primus.runtime.preemption import Preempted

if TYPE_CHECKING:
    from primus.config.provenance import Provenance
    from primus.runtime.context import RunContext

logger = logging.getLogger("primus.backends.nemo_automodel")


class AutoModelAdapter(BackendAdapter):
    name: ClassVar[str] = "nemo_automodel"
    distribution: ClassVar[str] = "nemo-automodel"
    import_probe: ClassVar[str | None] = "nemo_automodel.recipes.diffusion.train"
    extra: ClassVar[str] = "automodel"
    stages: ClassVar[tuple[str, ...]] = ("pretrain", "finetune")
    stage_aliases: ClassVar[dict[str, str]] = {"train": "pretrain"}

    def defaults(self, stage: str) -> dict[str, Any]:
        return {
            "recipe": "TrainDiffusionRecipe",
            "seed": 42,
            "checkpoint": {"enabled": True, "model_save_format": "safetensors", "save_consolidated": False},
        }

    # -- validation -------------------------------------------------------------------------
    def _handoff(self, module: ModuleConfig, *, checkpoint_dir: Path, resume: bool, dist_backend: str,
                 log=None, log_derived=None, where=None) -> Handoff:
        stage = self.canonical_stage(module.stage, where=f"modules.{module.name}.stage")
        return build_handoff(
            module.params, stage=stage, checkpoint_dir=checkpoint_dir, resume=resume, dist_backend=dist_backend,
            log=log or (lambda msg: None), log_derived=log_derived or (lambda key, value, reason: None),
            where=where or (lambda key: ""))

    def validate(self, module: ModuleConfig, provenance: "Provenance | None" = None) -> None:
        from primus.backends.nemo_automodel import schema

        self.require_installed()
        self.import_engine()

        def describe(key: str) -> str:
            """``file:line: `` of a key of this module (its params are under modules.<name>.)."""
            return f"{provenance.describe(f'modules.{module.name}.{key}')}: " if provenance is not None else ""

        handoff = self._handoff(module, checkpoint_dir=Path("checkpoints"), resume=False, dist_backend="gloo",
                                where=describe)
        schema.check(handoff.automodel, describe)

    # -- run --------------------------------------------------------------------------------
    def run(self, module: ModuleConfig, ctx: "RunContext") -> None:
        from primus.backends.nemo_automodel import schema
        from primus.backends.nemo_automodel.metrics import StepTap
        from primus.backends.nemo_automodel.patches import keep_primus_logging, one_train_line

        version = self.require_installed()
        if version not in schema.VALIDATED_VERSIONS:
            ctx.logger.warning("nemo-automodel %s is untested (validated: %s): config checks may be stale",
                               version, ", ".join(schema.VALIDATED_VERSIONS))
        self.canonical_stage(module.stage, where=f"modules.{module.name}.stage")
        if tiny_assets_of(module.params):
            ensure_tiny_assets(Path(expand_path(tiny_assets_of(module.params))), ctx.logger)
        handoff = self._handoff(module, checkpoint_dir=ctx.checkpoint_dir, resume=ctx.resume,
                                dist_backend=ctx.dist_backend, log=ctx.logger.info, log_derived=ctx.log_derived)
        cfg = handoff.automodel
        schema.check(cfg)
        self._check_fresh_checkpoint_dir(cfg, ctx)
        self._log_expert(cfg, ctx.logger)

        from nemo_automodel.components.config.loader import ConfigNode
        from nemo_automodel.recipes.diffusion.train import TrainDiffusionRecipe

        recipe = TrainDiffusionRecipe(ConfigNode(cfg))
        with keep_primus_logging():
            recipe.setup()
        self._log_sigma_window(recipe, ctx.logger)
        tap = StepTap(recipe, ctx.report_step, ctx.should_stop)
        try:
            with one_train_line():
                recipe.run_train_validation_loop()
        finally:
            tap.close()
        if getattr(recipe.step_scheduler, "sigterm_flag", False):
            # AutoModel's own distributed SIGTERM handler saved a checkpoint and ended the loop
            raise Preempted(int(recipe.step_scheduler.step), checkpointed=True)
        ctx.logger.info("nemo_automodel: %d optimizer steps, checkpoints in %s", len(tap.reports),
                        cfg["checkpoint"]["checkpoint_dir"])

    @staticmethod
    def _check_fresh_checkpoint_dir(cfg: dict[str, Any], ctx: "RunContext") -> None:
        """AutoModel silently resumes from any checkpoint it finds; without --resume that is a mistake."""
        if ctx.resume or cfg["checkpoint"].get("restore_from") or not cfg["checkpoint"].get("enabled", True):
            return
        from nemo_automodel.components.checkpoint.utils import find_latest_checkpoint

        latest = find_latest_checkpoint(cfg["checkpoint"]["checkpoint_dir"])
        if latest is not None:
            raise ConfigError(f"checkpoint '{latest}' already exists in this run dir: resume the run "
                              f"(--resume) or start a new one")

    @staticmethod
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

    @staticmethod
    def _log_sigma_window(recipe: Any, log: logging.Logger) -> None:
        if getattr(recipe, "stage", None) is None:
            return
        log.info("nemo_automodel: training '%s' on sigma in [%.4f, %.4f] (boundary_ratio=%.4f, %s)",
                 recipe.active_transformer, recipe.sigma_min, recipe.sigma_max, recipe.boundary_ratio,
                 "from config" if recipe.cfg.get("model.boundary_ratio") is not None else "from the pipeline")


def ensure_tiny_assets(root: Path, log: logging.Logger) -> None:
    """Build the tiny random pipeline + latent cache once per ``root`` (all ranks safe: file lock)."""
    root.mkdir(parents=True, exist_ok=True)
    done = root / ".complete"
    if done.exists():
        return
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return
        from primus.data.diffusion.tiny import build_tiny_assets

        log.info("nemo_automodel: tiny Wan 2.2 pipeline and latent cache not found: building them in %s", root)
        build_tiny_assets(root)
        done.write_text("ok\n")
