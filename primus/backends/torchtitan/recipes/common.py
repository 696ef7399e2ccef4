"""What every TorchTitan recipe shares: its own ``Trainer`` built from its own ``Trainer.Config``
(every key checked against the dataclass tree), the Primus components wired in through TorchTitan's
extension points (``hooks.py``), DCP checkpoints exported through the model's state-dict adapter.

A recipe differs in its dataloader (``dataloader_config``), what it checks last (``finish_config``)
and what it reads besides (``params``).
"""
from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primus.backends.torchtitan import hf_start
from primus.backends.torchtitan.checkpoint import STEP, foreign_checkpoint
from primus.config.errors import ConfigError
from primus.config.provenance import error_at
from primus.data.tiny_assets import built_by_prepare, tiny_assets_dir
from primus.plan.flops import flops_per_token
from primus.plan.sizing import LLM
from primus.runtime.adapter import CheckpointSpec, EnginePlan, HFWeights, ModuleConfig, Recipe
from primus.runtime.preemption import Preempted

if TYPE_CHECKING:
    from primus.config.provenance import Provenance
    from primus.plan.layout import ParallelLayout
    from primus.plan.model import ModelSpec
    from primus.plan.target import Target
    from primus.runtime.admission import Refusal
    from primus.runtime.context import RunContext

_TRAINER_STATE = ("optimizer", "lr_scheduler", "dataloader", "train_state")  # not model weights
TorchTitanPlan = EnginePlan[Any, "ModelSpec", "ParallelLayout"]  # engine_config: torchtitan.trainer.Trainer.Config


class TorchTitanRecipe(Recipe):
    """A TorchTitan run: its ``Trainer`` with Primus's metrics, checkpoint and stop hooks."""

    def defaults(self) -> dict[str, Any]:
        return {"attn_backend": "auto", "metrics": {"log_freq": 1}, "checkpoint": {"folder": "checkpoints"}}

    @abstractmethod
    def dataloader_config(self) -> Any:
        """A fresh dataloader ``Config`` for ``Trainer.Config.dataloader``, before the section's keys apply."""

    def finish_config(self, cfg: Any, attn_backend: str, fail: Callable[[str, str], ConfigError]) -> list:
        """The recipe's last checks and settings on the final config; returns derived settings."""
        return []

    @abstractmethod
    def params(self, module: ModuleConfig, derived: list) -> dict[str, Any]:
        """The section as ``build_trainer_config`` reads it (paths Primus points at filled in)."""

    def check_config(self, cfg: Any, module: ModuleConfig, provenance: "Provenance | None") -> None:
        """What the recipe checks of the built config that TorchTitan would only find at start-up."""

    def plan(self, module: ModuleConfig, world_size: int | None, provenance: "Provenance | None" = None, *,
             run_dir: Path | None = None, device: str = "cpu") -> TorchTitanPlan:
        """TorchTitan's own ``Trainer.Config``, every key checked against its dataclass tree."""
        self.adapter.import_engine()
        from primus.backends.torchtitan.config import build_trainer_config
        from primus.backends.torchtitan.plan import parallel_layout

        derived: list[tuple[str, Any, str]] = []
        params = self.params(module, derived)
        cfg, spec, more = build_trainer_config(params, run_dir=run_dir or Path("."), device=device,
                                               provenance=provenance, prefix=module.prefix,
                                               dataloader=self.dataloader_config(), finish=self.finish_config)
        self.check_config(cfg, module, provenance)
        if world_size is not None:
            _check_world_size(module, world_size, provenance)
        layout = parallel_layout(params, world_size, spec.n_layers, device)  # the model is `spec`, built once above
        directory = Path(cfg.dump_folder) / cfg.checkpoint.folder
        source = hf_start.hf_source(params)  # TorchTitan loads these safetensors itself
        checkpoint = CheckpointSpec(directory, load=str(source) if source else None, format="hf" if source else "native",
                                    step_pattern=STEP, foreign=foreign_checkpoint)
        plan = EnginePlan(module, self, world_size, cfg, checkpoint, spec, layout, sizing=LLM,
                          flops_per_token=flops_per_token(spec, cfg.training.seq_len))
        for key, value, reason in [*derived, *more]:
            plan.derive(key, value, reason)
        return plan

    def check_inputs(self, plan: TorchTitanPlan, provenance: "Provenance | None" = None) -> None:
        hf_start.check_hf_start(plan, provenance)  # HF tensors vs the model
        from primus.compat.hub import is_hub_id

        cfg, prefix = plan.engine_config, plan.module.prefix
        # a Hub id (meta-llama/Llama-3.1-8B) is fetched by prepare (primus/compat/hub.py)
        checks = [] if is_hub_id(cfg.hf_assets_path) else [("hf_assets_path", Path(cfg.hf_assets_path) / "tokenizer.json")]
        checks += [(f"dataloader.blend[{2 * i + 1}]", Path(path).expanduser())
                   for i, path in enumerate(getattr(cfg.dataloader, "blend", [])[1::2])]
        checks += [(f"dataloader.{key}", Path(path).expanduser()) for key in self.data_keys
                   if (path := getattr(cfg.dataloader, key, None)) and getattr(cfg.dataloader, "dataset", None) != "mock"]
        for key, path in checks:
            if not path.exists() and not built_by_prepare(path, plan.module.params):
                raise error_at(provenance, f"{prefix}.{key}", f"{path} does not exist")

    data_keys: tuple[str, ...] = ("dataset_path",)  # the dataloader's files check_inputs looks for

    def admit(self, plan: TorchTitanPlan, target: "Target") -> "list[Refusal]":
        """A float8 converter the target cannot run (``float8.py``); the launch, dry-run, validate and plan ask."""
        from primus.backends.torchtitan.float8 import admission_refusal
        from primus.runtime.admission import Refusal

        problem = admission_refusal(plan.module.params, target)
        if problem is None:
            return []
        key, reason = problem
        return [Refusal(key, "float8", f"cannot run on {target.describe()} ({reason})")]

    def resume_problem(self, plan: TorchTitanPlan, resuming: bool) -> str | None:
        """DCP reshards the model and optimizer over any FSDP / TP / PP layout; TorchTitan's dataloader state
        only at the data-parallel degree that wrote it (``data.py``)."""
        from primus.backends.torchtitan.data import dataloader_problem
        from primus.runtime.checkpoints import newest_usable

        cfg = plan.engine_config
        if not resuming or not cfg.checkpoint.enable or plan.world_size is None:
            return None
        step = cfg.checkpoint.load_step if cfg.checkpoint.load_step >= 0 else \
            newest_usable(plan.checkpoint.directory, STEP, warn=lambda _message: None, foreign=foreign_checkpoint)
        checkpoint = plan.checkpoint.directory / f"step-{step}"
        return dataloader_problem(checkpoint, cfg, plan.world_size) if step is not None and checkpoint.is_dir() else None

    def prepare(self, plan: TorchTitanPlan, log: Callable[[str], None]) -> list:
        from primus.compat.hub import localize

        if tiny_assets_dir(plan.module.params) is None:  # a tokenizer named by Hub id: this node's copy
            from primus.runtime.adapter import Derived

            token = (plan.module.params.get("primus") or {}).get("hf_token")
            return [Derived(*item) for item in localize(plan.module.params, [("hf_assets_path", "tokenizer")],
                                                         token=token)]
        self.build_tiny_assets(plan, tiny_assets_dir(plan.module.params), log)
        return []

    @abstractmethod
    def build_tiny_assets(self, plan: TorchTitanPlan, root: Path, log: Callable[[str], None]) -> None:
        """The files ``primus.tiny_assets`` points this recipe at (idempotent, file-locked)."""

    def before_build(self, plan: TorchTitanPlan, ctx: "RunContext") -> None:
        """What the recipe wires into TorchTitan before its trainer is built."""


    def run(self, plan: TorchTitanPlan, ctx: "RunContext") -> None:
        """The run, with the compatibility patches it needs applied for its length (undone after)."""
        from primus.backends.torchtitan.patches import ENGINE, PATCHES, run_uses
        from primus.runtime.patches import Patcher, Where

        with Patcher(PATCHES, Where.here(run_uses(plan.engine_config.model_spec))) as patcher:
            patcher.log(ctx.logger, ENGINE)
            self._train(plan, ctx)

    def _train(self, plan: TorchTitanPlan, ctx: "RunContext") -> None:
        cfg = plan.engine_config
        import torch.distributed as dist

        from primus.backends.torchtitan.hooks import with_primus_components

        plan.log_derived(ctx)
        log_blend(cfg, plan.world_size or 1, ctx.logger)
        if ctx.resume and not cfg.checkpoint.enable:
            ctx.logger.warning("--resume given but checkpoint.enable is false: starting from step 0")
        if cfg.checkpoint.enable and cfg.checkpoint.load_step < 0:  # skip a damaged newest checkpoint
            from primus.runtime.checkpoints import newest_usable

            step = newest_usable(ctx.checkpoint_dir, STEP, foreign=foreign_checkpoint)
            cfg.checkpoint.load_step = cfg.checkpoint.load_step if step is None else step
        hf_start.log_start(plan.checkpoint, ctx.logger)  # which HF checkpoint the run starts from
        hf_config = getattr(cfg.model_spec.model, "_primus_hf_config", None)
        if hf_config is not None:  # Llama 4: the backend reads the model's shapes from hf_model/config.json
            from primus.backends.torchtitan.llama4 import write_hf_config

            write_hf_config(cfg.hf_model, hf_config)
        self.before_build(plan, ctx)
        trainer = with_primus_components(cfg).build()
        trainer.attach(ctx, plan.flops_per_token)
        try:
            trainer.train()
            if trainer.stopping:  # SIGTERM: this step was checkpointed (when checkpoints are on)
                trainer.checkpointer.maybe_wait_for_saving()
                if not cfg.checkpoint.enable:
                    ctx.logger.warning("SIGTERM with checkpoint.enable=false: stopping without a checkpoint")
                raise Preempted(trainer.step, cfg.checkpoint.enable)
        finally:
            trainer.close()
            if dist.is_initialized():
                dist.destroy_process_group()

    def export(self, plan: TorchTitanPlan, step: int | None, warn: Callable[[str], None] | None = None) -> HFWeights:
        """Through the model TorchTitan built and its own state-dict adapter's ``to_hf``; the step read is
        verified whole and TorchTitan's (else the newest such one, said)."""
        from primus.backends.checkpoint_io import read_dcp_tensors
        from primus.runtime.checkpoints import pick_checkpoint

        root = plan.checkpoint.directory
        step, path = pick_checkpoint(root, STEP, step, foreign=foreign_checkpoint, warn=warn)
        titan = plan.engine_config.model_spec
        if titan.state_dict_adapter is None:
            raise ConfigError(f"{root.parent}: TorchTitan's {titan.name} model has no Hugging Face state-dict adapter")
        to_hf = titan.state_dict_adapter(titan.model, None).to_hf
        tensors = read_dcp_tensors(path, lambda key: not key.startswith(_TRAINER_STATE))
        source = Path(plan.checkpoint.load) if plan.checkpoint.format == "hf" else None
        return HFWeights(to_hf(tensors), plan.model, source, plan.engine_config.hf_assets_path, path, step)


def log_blend(cfg: Any, world_size: int, logger: Any) -> None:
    """``dataloader.blend``: the blend and the sequences each dataset gives over the run, in the run's log."""
    from primus.backends.torchtitan.data import blend_summary, data_parallel_degree

    training, dp = cfg.training, data_parallel_degree(cfg.parallelism, world_size)
    per_step = training.global_batch_size if training.global_batch_size > 0 else training.local_batch_size * dp
    line = blend_summary(cfg.dataloader, training.steps * per_step // dp, dp)
    if line:
        logger.info(line)


def build_tiny_sft_assets(root: Path, log: Callable[[str], None]) -> None:
    """The tiny HF model (and instruction set) a run from a HF checkpoint names under ``primus.tiny_assets``."""
    from primus.hf.tiny import ensure_tiny_sft_assets

    log(f"tiny Hugging Face model and instruction set in {root} (primus.tiny_assets)")
    ensure_tiny_sft_assets(root)


def _check_world_size(module: ModuleConfig, world_size: int, provenance: "Provenance | None") -> None:
    """TorchTitan checks dp x tp x pp x cp == world size at start-up; say it before launch."""
    parallel = module.params.get("parallelism") or {}
    degrees = {key: parallel.get(key, 1) for key in ("data_parallel_replicate_degree", "tensor_parallel_degree",
                                                     "pipeline_parallel_degree", "context_parallel_degree")}
    shard = parallel.get("data_parallel_shard_degree", -1)
    fixed = degrees["data_parallel_replicate_degree"] * degrees["tensor_parallel_degree"] * \
        degrees["pipeline_parallel_degree"] * degrees["context_parallel_degree"]
    product = fixed * shard if shard > 0 else fixed
    if (shard > 0 and product != world_size) or (shard <= 0 and world_size % fixed):
        layout = " x ".join(f"{k.replace('_degree', '')}={v}" for k, v in {**degrees,
                            "data_parallel_shard_degree": shard}.items())
        raise error_at(provenance, f"{module.prefix}.parallelism", f"{layout} does not fit the world size "
                       f"{world_size} (the degrees must multiply to it; shard -1 fills it)")
    from primus.backends.torchtitan.config import expert_layout_problem  # EP inside dp_shard x cp x tp

    problem = expert_layout_problem(parallel, world_size)
    if problem:
        raise error_at(provenance, f"{module.prefix}.parallelism.expert_parallel_degree", problem)
