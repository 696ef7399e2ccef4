"""TorchTitan behind the adapter contract: its own ``Trainer`` from its own ``Trainer.Config``."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primus.config.errors import ConfigError
from primus.config.provenance import Provenance
from primus.data.tiny_assets import tiny_assets_dir
from primus.hf import torchtitan_start as hf_start
from primus.plan.flops import flops_per_token
from primus.runtime.adapter import BackendAdapter, CheckpointSpec, EnginePlan, ModuleConfig
from primus.runtime.context import RunContext
from primus.runtime.preemption import Preempted

if TYPE_CHECKING:
    from primus.plan.target import Target
    from primus.runtime.admission import Refusal


def _with_tiny_assets(params: dict[str, Any], derived: list[tuple[str, Any, str]] | None = None) -> dict[str, Any]:
    """Point the tokenizer and dataset at the locally built tiny assets, when asked to."""
    root = tiny_assets_dir(params)
    if root is None:
        return params
    params = {**params, "dataloader": {**(params.get("dataloader") or {})}}
    params["hf_assets_path"] = str(root / "tokenizer")
    params["dataloader"]["dataset_path"] = str(root / "corpus")
    params["dataloader"]["dataset"] = "jsonl"
    if derived is not None:
        derived.append(("hf_assets_path", params["hf_assets_path"], "primus.tiny_assets"))
        derived.append(("dataloader.dataset_path", params["dataloader"]["dataset_path"], "primus.tiny_assets"))
        derived.append(("dataloader.dataset", "jsonl", "primus.tiny_assets"))
    return params


def register_local_datasets() -> None:
    """TorchTitan's extension point for datasets is its ``DATASETS`` table: add local files."""
    from datasets import load_dataset
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets.text_datasets import DATASETS

    def files(path: str, pattern: str) -> list[str]:
        p = Path(path)
        return sorted(str(f) for f in p.glob(pattern)) if p.is_dir() else [str(p)]

    DATASETS.setdefault("jsonl", DatasetConfig(
        path="", sample_processor=lambda sample: sample["text"],
        loader=lambda path: load_dataset("json", data_files=files(path, "*.jsonl"), split="train")))
    DATASETS.setdefault("text", DatasetConfig(
        path="", sample_processor=lambda sample: sample["text"],
        loader=lambda path: load_dataset("text", data_files=files(path, "*.txt"), split="train")))
    from primus.backends.torchtitan import mock_data

    mock_data.register(DATASETS)  # AMD Primus's training.mock_data


def log_blend(cfg: Any, world_size: int, logger: Any) -> None:
    """``dataloader.blend``: the blend and the sequences each dataset gives over the run, in the run's log."""
    from primus.backends.torchtitan.data import blend_summary, data_parallel_degree

    training, dp = cfg.training, data_parallel_degree(cfg.parallelism, world_size)
    per_step = training.global_batch_size if training.global_batch_size > 0 else training.local_batch_size * dp
    line = blend_summary(cfg.dataloader, training.steps * per_step // dp, dp)
    if line:
        logger.info(line)


class TorchTitanAdapter(BackendAdapter):
    name = "torchtitan"
    distribution = "torchtitan"
    import_probe = "torchtitan.trainer"
    extra = "torchtitan"
    stages = ("pretrain", "sft")
    stage_aliases = {"train": "pretrain"}

    def defaults(self, stage: str) -> dict[str, Any]:
        return {"attn_backend": "auto", "metrics": {"log_freq": 1}, "checkpoint": {"folder": "checkpoints"}}

    def plan(self, module: ModuleConfig, world_size: int | None, provenance: Provenance | None = None, *,
             run_dir: Path | None = None, device: str = "cpu") -> EnginePlan:
        """TorchTitan's own ``Trainer.Config``, every key checked against its dataclass tree."""
        from primus.backends.torchtitan.patches import apply_patches

        apply_patches()
        self.import_engine()
        register_local_datasets()
        from primus.backends.torchtitan.config import build_trainer_config
        from primus.backends.torchtitan.plan import parallel_layout

        prefix = f"modules.{module.name}"
        derived: list[tuple[str, Any, str]] = []
        params = _params(module, derived)
        cfg, spec, more = build_trainer_config(params, run_dir=run_dir or Path("."), device=device,
                                               provenance=provenance, prefix=prefix, stage=module.stage)
        if module.stage != "sft":  # the SFT dataloader names no registered dataset
            _check_dataset(cfg, prefix, provenance)
        if world_size is not None:
            _check_world_size(module, world_size, provenance)
        layout = parallel_layout(params, world_size, spec.n_layers, device)  # the model is `spec`, built once above
        directory = Path(cfg.dump_folder) / cfg.checkpoint.folder
        source = hf_start.hf_source(params)  # [#15] TorchTitan loads these safetensors itself
        checkpoint = CheckpointSpec(directory, load=str(source), format="hf") if source else CheckpointSpec(directory)
        plan = EnginePlan(module, world_size, cfg, checkpoint, spec, layout,
                          flops_per_token=flops_per_token(spec, cfg.training.seq_len))
        for key, value, reason in [*derived, *more]:
            plan.derive(key, value, reason)
        return plan

    def describe(self, module: ModuleConfig, world_size: int | None, provenance: Provenance | None = None, *,
                 device: str = "cpu"):
        """From TorchTitan's registry as tools/gen_torchtitan_plan_table.py recorded it, without importing
        torch or TorchTitan; the engine's own config where the table cannot tell (post-training, Llama 4,
        a registry keyword it does not cover)."""
        from primus.backends.torchtitan.config import BuildContext
        from primus.backends.torchtitan.plan import describe

        if hf_start.is_post_training(module.params, module.stage):
            return super().describe(module, world_size, provenance, device=device)
        if world_size is not None:
            _check_world_size(module, world_size, provenance)
        found = describe(module.params, world_size, device, BuildContext(provenance, f"modules.{module.name}").fail)
        return found if found is not None else super().describe(module, world_size, provenance, device=device)

    def derived_params(self, params: dict[str, Any], stage: str = "pretrain") -> list[tuple[str, Any, str]]:
        """What ``primus.tiny_assets`` sets; resolution records it, so ``config show --why`` tells (ux, #18).
        A run from a HF checkpoint names its own files: tiny assets only build them (``_params``)."""
        derived: list[tuple[str, Any, str]] = []
        if not hf_start.is_post_training(params, self.stage_aliases.get(stage, stage)):
            _with_tiny_assets(params, derived)
        return derived

    def admit(self, plan: EnginePlan, target: "Target") -> "list[Refusal]":
        """A float8 converter the target cannot run (``float8.py``); the launch, dry-run, validate and plan ask."""
        from primus.backends.torchtitan.float8 import admission_refusal
        from primus.runtime.admission import Refusal

        problem = admission_refusal(plan.module.params, target)
        if problem is None:
            return []
        key, reason = problem
        return [Refusal(key, "float8", f"cannot run on {target.describe()} ({reason})")]

    def prepare(self, plan: EnginePlan, log: Callable[[str], None]) -> None:
        root = tiny_assets_dir(plan.module.params)
        if root is not None and hf_start.is_post_training(plan.module.params, plan.module.stage):
            _build_tiny_sft_assets(plan.module, log)  # [#15] tiny HF model + instruction set
            return
        if root is not None and not (root / "corpus" / "data.jsonl").exists():
            from primus.data.tiny_assets import ensure_tiny_assets

            log(f"building the tiny tokenizer and learnable corpus in {root} (primus.tiny_assets)")
            ensure_tiny_assets(root)

    def check_inputs(self, plan: EnginePlan, provenance: Provenance | None = None) -> None:
        module = plan.module
        post_training = hf_start.is_post_training(module.params, module.stage)
        if post_training:  # HF tensors vs the model, instruction files
            hf_start.check_inputs(plan, provenance=provenance)
        from primus.compat.hub import is_hub_id

        cfg, prefix = plan.engine_config, f"modules.{module.name}"
        checks = [(f"dataloader.blend[{2 * i + 1}]", Path(path))
                  for i, path in enumerate(getattr(cfg.dataloader, "blend", [])[1::2])]
        if post_training or tiny_assets_dir(module.params) is None:  # else built by prepare() before the ranks start
            # a Hub id (meta-llama/Llama-3.1-8B) is fetched when the run starts (primus/compat/hub.py)
            if not is_hub_id(cfg.hf_assets_path):
                checks.append(("hf_assets_path", Path(cfg.hf_assets_path) / "tokenizer.json"))
            if getattr(cfg.dataloader, "dataset_path", None) and getattr(cfg.dataloader, "dataset", None) != "mock":
                checks.append(("dataloader.dataset_path", Path(cfg.dataloader.dataset_path)))
        for key, path in checks:
            if not path.exists():
                full = f"{prefix}.{key}"
                where = f"{provenance.describe(full)}: " if provenance is not None else ""
                raise ConfigError(f"{where}{full}: {path} does not exist")

    def resume_problem(self, plan: EnginePlan, resuming: bool) -> str | None:
        """DCP reshards the model and optimizer over any FSDP / TP / PP layout; TorchTitan's dataloader state
        only at the data-parallel degree that wrote it (``data.py``)."""
        from primus.backends.torchtitan.data import dataloader_problem
        from primus.runtime.checkpoints import newest_usable

        cfg = plan.engine_config
        if not resuming or not cfg.checkpoint.enable or plan.world_size is None:
            return None
        step = cfg.checkpoint.load_step if cfg.checkpoint.load_step >= 0 else \
            newest_usable(plan.checkpoint.directory, "torchtitan", warn=lambda _message: None)
        checkpoint = plan.checkpoint.directory / f"step-{step}"
        return dataloader_problem(checkpoint, cfg, plan.world_size) if step is not None and checkpoint.is_dir() else None

    def run(self, plan: EnginePlan, ctx: RunContext) -> None:
        from primus.backends.torchtitan.float8 import converted_linears
        from primus.backends.torchtitan.patches import apply_float8_patches, apply_patches

        cfg = plan.engine_config
        float8 = [*apply_float8_patches()] if converted_linears(cfg.model_spec.model) else []
        for name in [*apply_patches(), *float8]:
            ctx.logger.info("applied TorchTitan compatibility patch: %s", name)
        import torch.distributed as dist

        from primus.backends.torchtitan.hooks import with_primus_components

        plan.log_derived(ctx)
        log_blend(cfg, plan.world_size or 1, ctx.logger)
        if ctx.resume and not cfg.checkpoint.enable:
            ctx.logger.warning("--resume given but checkpoint.enable is false: starting from step 0")
        if cfg.checkpoint.enable and cfg.checkpoint.load_step < 0:  # (rel, #16) skip a damaged newest checkpoint
            from primus.runtime.checkpoints import newest_usable

            step = newest_usable(ctx.checkpoint_dir, "torchtitan")
            cfg.checkpoint.load_step = cfg.checkpoint.load_step if step is None else step
        hf_start.log_start(plan.checkpoint, ctx.logger)  # [#15] which HF checkpoint the run starts from
        hf_config = getattr(cfg.model_spec.model, "_primus_hf_config", None)
        if hf_config is not None:  # Llama 4: the backend reads the model's shapes from hf_model/config.json
            from primus.backends.torchtitan.llama4 import write_hf_config
            from primus.backends.torchtitan.patches import apply_hf_backend_patches

            for name in apply_hf_backend_patches():
                ctx.logger.info("applied TorchTitan compatibility patch: %s", name)
            write_hf_config(cfg.hf_model, hf_config)
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


def _params(module: ModuleConfig, derived: list) -> dict[str, Any]:
    """[#15] A run from a HF checkpoint / on instructions names its files itself: primus.tiny_assets only
    builds them (never overrides hf_assets_path), and the model comes from the checkpoint's config.json."""
    if not hf_start.is_post_training(module.params, module.stage):
        return _with_tiny_assets(module.params, derived)
    if tiny_assets_dir(module.params) is not None:
        _build_tiny_sft_assets(module, lambda message: None)
    return hf_start.with_hf_start(module.params, module.stage, derived, prefix=f"modules.{module.name}")


def _build_tiny_sft_assets(module: ModuleConfig, log: Callable[[str], None]) -> None:
    from primus.hf.tiny import ensure_tiny_sft_assets

    root = tiny_assets_dir(module.params)
    log(f"tiny Hugging Face model and instruction set in {root} (primus.tiny_assets)")
    ensure_tiny_sft_assets(root)


def _check_dataset(cfg: Any, prefix: str, provenance: Provenance | None) -> None:
    from torchtitan.hf_datasets.text_datasets import DATASETS

    from primus.config.errors import did_you_mean

    dataset = getattr(cfg.dataloader, "dataset", None)
    if dataset is not None and dataset.lower() not in DATASETS:
        key = f"{prefix}.dataloader.dataset"
        where = provenance.describe(key) if provenance is not None else key
        raise ConfigError(f"{where}: {key}: unknown dataset '{dataset}'"
                          f"{did_you_mean(dataset, DATASETS)}; known: {', '.join(DATASETS)}")


def _check_world_size(module: ModuleConfig, world_size: int, provenance: Provenance | None) -> None:
    """TorchTitan checks dp x tp x pp x cp == world size at start-up; say it before launch."""
    parallel = module.params.get("parallelism") or {}
    degrees = {key: parallel.get(key, 1) for key in ("data_parallel_replicate_degree", "tensor_parallel_degree",
                                                     "pipeline_parallel_degree", "context_parallel_degree")}
    shard = parallel.get("data_parallel_shard_degree", -1)
    fixed = degrees["data_parallel_replicate_degree"] * degrees["tensor_parallel_degree"] * \
        degrees["pipeline_parallel_degree"] * degrees["context_parallel_degree"]
    product = fixed * shard if shard > 0 else fixed
    if (shard > 0 and product != world_size) or (shard <= 0 and world_size % fixed):
        key = f"modules.{module.name}.parallelism"
        where = provenance.describe(key) if provenance is not None else key
        layout = " x ".join(f"{k.replace('_degree', '')}={v}" for k, v in {**degrees,
                            "data_parallel_shard_degree": shard}.items())
        raise ConfigError(f"{where}: {key}: {layout} does not fit the world size "
                          f"{world_size} (the degrees must multiply to it; shard -1 fills it)")
    from primus.backends.torchtitan.config import expert_layout_problem  # [tt] EP inside dp_shard x cp x tp

    problem = expert_layout_problem(parallel, world_size)
    if problem:
        key = f"modules.{module.name}.parallelism.expert_parallel_degree"
        raise ConfigError(f"{provenance.describe(key) if provenance is not None else key}: {key}: {problem}")
