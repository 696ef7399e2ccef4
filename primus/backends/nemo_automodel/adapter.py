"""NeMo AutoModel backend: Wan 2.2 text-to-video flow-matching training.

The module section mirrors AutoModel's diffusion YAML (model, step_scheduler, data, optimizer,
flow_matching, fsdp, checkpoint, ...). The plan takes out Primus's ``primus:`` block, derives what
Primus owns (mode from the stage, checkpoint dir, process-group backend), checks every key against
what AutoModel 0.7.0 reads, and the run hands a ``ConfigNode`` to ``TrainDiffusionRecipe``;
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
from primus.backends.nemo_automodel.plan import plan_inputs_if_known as wan_plan_inputs
from primus.config.errors import ConfigError
from primus.data.tiny_assets import tiny_assets_dir
from primus.runtime.adapter import BackendAdapter, CheckpointSpec, EnginePlan, ModuleConfig
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
    stages: ClassVar[tuple[str, ...]] = ("pretrain", "finetune", "sft")  # sft: the LLM recipe (llm.py)
    stage_aliases: ClassVar[dict[str, str]] = {"train": "pretrain"}
    data_commands: ClassVar[tuple[str, ...]] = ("primus.data.diffusion.cli",)

    def defaults(self, stage: str) -> dict[str, Any]:
        if stage == "sft":  # [#15] TrainFinetuneRecipeForNextTokenPrediction (primus/backends/nemo_automodel/llm.py)
            from primus.backends.nemo_automodel import llm

            return llm.defaults()
        return {
            "recipe": "TrainDiffusionRecipe",
            "seed": 42,
            "checkpoint": {"enabled": True, "model_save_format": "safetensors", "save_consolidated": False},
        }

    def plan(self, module: ModuleConfig, world_size: int | None, provenance: "Provenance | None" = None, *,
             run_dir: Path | None = None, device: str = "cpu") -> EnginePlan:
        """AutoModel's own config (the hand-off dict), every key checked against what 0.7.0 reads."""
        from primus.backends.nemo_automodel import schema
        from primus.config.provenance import Provenance
        from primus.config.schema import PrimusOptions, validate_model

        self.require_installed()
        prefix = f"modules.{module.name}"
        validate_model(PrimusOptions, module.params.get("primus") or {}, provenance or Provenance(), f"{prefix}.primus")
        stage = self.canonical_stage(module.stage, where=f"{prefix}.stage")
        if stage == "sft":  # [#15] the LLM fine-tuning recipe
            from primus.backends.nemo_automodel import llm

            return llm.plan(module, world_size, provenance, run_dir=run_dir, device=device)
        checkpoint_dir = (run_dir or Path(".")) / "checkpoints"
        plan = EnginePlan(module, world_size, None, CheckpointSpec(checkpoint_dir))

        def where(key: str) -> str:
            return f"{provenance.describe(f'{prefix}.{key}')}: " if provenance is not None else ""

        try:
            plan.engine_config = build_handoff(module.params, stage=stage, checkpoint_dir=checkpoint_dir,
                                               dist_backend="nccl" if device.startswith("cuda") else "gloo",
                                               plan=plan)
        except ConfigError as exc:
            raise ConfigError(f"{where(exc.key)}{exc}" if exc.key else str(exc), key=exc.key) from None
        self.import_engine()
        schema.check(plan.engine_config, where)
        restore = plan.engine_config["checkpoint"].get("restore_from")
        if restore and restore != "LATEST":
            plan.checkpoint = CheckpointSpec(checkpoint_dir, load=str(restore))
        plan.model, plan.layout = wan_plan_inputs(module.params, world_size)  # ux (#18): Wan for plan/preflight
        return plan

    def prepare(self, plan: EnginePlan, log: Callable[[str], None]) -> None:
        root = tiny_assets_dir(plan.module.params)
        if root is not None and plan.module.stage == "sft":  # [#15] tiny HF model + instruction set
            from primus.hf.tiny import ensure_tiny_sft_assets

            log(f"tiny Hugging Face model and instruction set in {root} (primus.tiny_assets)")
            ensure_tiny_sft_assets(root)
        elif root is not None:
            ensure_tiny_assets(root, log)

    def check_inputs(self, plan: EnginePlan, provenance: "Provenance | None" = None) -> None:
        if plan.module.stage == "sft" and tiny_assets_dir(plan.module.params) is None:  # [#15]
            from primus.backends.nemo_automodel import llm

            return llm.check_inputs(plan, provenance)
        if tiny_assets_dir(plan.module.params) is not None:
            return  # built by prepare() before the ranks start
        cfg, prefix = plan.engine_config, f"modules.{plan.module.name}"
        checks = [("model.pretrained_model_name_or_path", cfg["model"]["pretrained_model_name_or_path"])]
        checks += [(f"data.{name}.cache_dir", loader["cache_dir"]) for name, loader in (cfg.get("data") or {}).items()
                   if isinstance(loader, dict) and loader.get("cache_dir")]
        for key, value in checks:
            if str(value).startswith((".", "/")) and not Path(value).exists():
                full = f"{prefix}.{key}"
                where = f"{provenance.describe(full)}: " if provenance is not None else ""
                raise ConfigError(f"{where}{full}: {value} does not exist")

    def run(self, plan: EnginePlan, ctx: "RunContext") -> None:
        from primus.backends.nemo_automodel.hooks import StepTap
        from primus.backends.nemo_automodel.patches import (check_version, checkpoint_on_transient_group,
                                                           keep_primus_logging, one_train_line)

        check_version(self.require_installed(), ctx.logger.warning)
        plan.log_derived(ctx)
        cfg = plan.engine_config
        if plan.module.stage == "sft":  # [#15] the LLM fine-tuning recipe
            from primus.backends.nemo_automodel import llm

            self._check_fresh_checkpoint_dir(cfg, ctx)
            return llm.run(plan, ctx)
        if ctx.resume and not cfg["checkpoint"].get("restore_from"):
            cfg["checkpoint"]["restore_from"] = "LATEST"
        self._check_fresh_checkpoint_dir(cfg, ctx)
        self._log_expert(cfg, ctx.logger)

        from nemo_automodel.components.config.loader import ConfigNode
        from nemo_automodel.recipes.diffusion.train import TrainDiffusionRecipe

        recipe = TrainDiffusionRecipe(ConfigNode(cfg))
        with keep_primus_logging(), checkpoint_on_transient_group():  # perf #17: resume loads too
            recipe.setup()
        self._log_sigma_window(recipe, ctx.logger)
        tap = StepTap(recipe, ctx.report_step, ctx.should_stop, ctx.instruments.clock)
        try:
            with one_train_line(), checkpoint_on_transient_group():  # perf #17: no OpenMP pools left
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
