"""TorchTitan behind the adapter contract: its own ``Trainer`` from its own ``Trainer.Config``."""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from primus.config.errors import ConfigError
from primus.config.provenance import Provenance
from primus.data.tiny_assets import tiny_assets_dir
from primus.hf import torchtitan_start as hf_start
from primus.runtime.adapter import BackendAdapter, ModuleConfig
from primus.runtime.context import RunContext
from primus.plan.flops import dense_decoder_flops_per_token
from primus.runtime.metrics import StepReport
from primus.runtime.preemption import Preempted


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


class _StepReporter:
    """Times each ``train_step`` and forwards TorchTitan's global loss to Primus' reporter."""

    def __init__(self, trainer: Any, ctx: RunContext, flops_per_token: float, tokens_per_step: int, seq_len: int):
        self.ctx, self.flops_per_token, self.tokens, self.seq_len = ctx, flops_per_token, tokens_per_step, seq_len
        self.pending: dict[str, Any] = {}
        self._train_step = trainer.train_step
        self._log = trainer.metrics_processor.log
        self.trainer = trainer
        trainer.train_step = self.train_step
        trainer.metrics_processor.log = self.log

    def log(self, step: int, global_avg_loss: float, global_max_loss: float, grad_norm: float,
            extra_metrics: dict[str, Any] | None = None) -> None:
        extra = extra_metrics or {}
        lr = next((v for k, v in extra.items() if k.startswith("lr")), None)
        self.pending = {"loss": global_avg_loss, "grad_norm": grad_norm, "lr": lr}
        self._log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra_metrics)

    def train_step(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = self._train_step(*args, **kwargs)
        elapsed = time.perf_counter() - start
        if self.pending:
            self.ctx.report_step(StepReport(
                step=self.trainer.step, loss=float(self.pending["loss"]), step_time_s=elapsed,
                samples=self.tokens // self.seq_len, tokens=self.tokens, flops=self.flops_per_token * self.tokens,
                lr=self.pending["lr"], grad_norm=float(self.pending["grad_norm"]),
            ))
            self.pending = {}
        if self.ctx.should_stop():
            self._checkpoint_and_stop()
        return result

    def _checkpoint_and_stop(self) -> None:
        """SIGTERM: save the full training state at this step (whatever the interval), then stop."""
        checkpointer, step = self.trainer.checkpointer, self.trainer.step
        saved = False
        if checkpointer.enable:
            interval, checkpointer.interval = checkpointer.interval, 1
            try:
                checkpointer.save(step)
                checkpointer.maybe_wait_for_saving()
                saved = True
            finally:
                checkpointer.interval = interval
        else:
            self.ctx.logger.warning("SIGTERM with checkpoint.enable=false: stopping without a checkpoint")
        raise Preempted(step, saved)


class TorchTitanAdapter(BackendAdapter):
    name = "torchtitan"
    distribution = "torchtitan"
    import_probe = "torchtitan.trainer"
    extra = "torchtitan"
    stages = ("pretrain", "sft")
    stage_aliases = {"train": "pretrain"}

    def _params(self, module: ModuleConfig, derived: list | None = None) -> dict[str, Any]:
        """[#15] A run from a HF checkpoint / on instructions names its files itself: primus.tiny_assets only
        builds them (never overrides hf_assets_path), and the model comes from the checkpoint's config.json."""
        stage = self.canonical_stage(module.stage)
        if not hf_start.is_post_training(module.params, stage):
            return _with_tiny_assets(module.params, derived)
        if tiny_assets_dir(module.params) is not None:
            self.prepare(module, lambda message: None)
        return hf_start.with_hf_start(module.params, stage, derived, prefix=f"modules.{module.name}")

    def defaults(self, stage: str) -> dict[str, Any]:
        return {"attn_backend": "auto", "metrics": {"log_freq": 1}, "checkpoint": {"folder": "checkpoints"}}

    def prepare(self, module: ModuleConfig, log: Callable[[str], None]) -> None:
        root = tiny_assets_dir(module.params)
        if root is not None and hf_start.is_post_training(module.params, self.canonical_stage(module.stage)):
            from primus.hf.tiny import ensure_tiny_sft_assets  # [#15] tiny HF model + instruction set

            log(f"tiny Hugging Face model and instruction set in {root} (primus.tiny_assets)")
            ensure_tiny_sft_assets(root)
            return
        if root is not None and not (root / "corpus" / "data.jsonl").exists():
            from primus.data.tiny_assets import ensure_tiny_assets

            log(f"building the tiny tokenizer and learnable corpus in {root} (primus.tiny_assets)")
            ensure_tiny_assets(root)

    def validate(self, module: ModuleConfig, provenance: Provenance) -> None:
        import torch

        from primus.backends.torchtitan.patches import apply_patches

        apply_patches()
        self.import_engine()
        register_local_datasets()
        from primus.backends.torchtitan.config import build_trainer_config

        prefix = f"modules.{module.name}"
        params = self._params(module)
        stage = self.canonical_stage(module.stage)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        cfg, _, _ = build_trainer_config(params, run_dir=Path("."), device=device, provenance=provenance,
                                         prefix=prefix, stage=stage)
        if stage == "sft":
            return  # the SFT dataloader names no registered dataset
        from torchtitan.hf_datasets.text_datasets import DATASETS

        from primus.config.errors import did_you_mean

        dataset = getattr(cfg.dataloader, "dataset", None)
        if dataset is not None and dataset.lower() not in DATASETS:
            key = f"{prefix}.dataloader.dataset"
            raise ConfigError(f"{provenance.describe(key)}: {key}: unknown dataset '{dataset}'"
                              f"{did_you_mean(dataset, DATASETS)}; known: {', '.join(DATASETS)}")

    def check_world_size(self, module: ModuleConfig, world_size: int, provenance: Provenance) -> None:
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
            layout = " x ".join(f"{k.replace('_degree', '')}={v}" for k, v in {**degrees,
                                "data_parallel_shard_degree": shard}.items())
            raise ConfigError(f"{provenance.describe(key)}: {key}: {layout} does not fit the world size "
                              f"{world_size} (the degrees must multiply to it; shard -1 fills it)")

    def check_inputs(self, module: ModuleConfig, provenance: Provenance) -> None:
        params = module.params
        prefix = f"modules.{module.name}"
        stage = self.canonical_stage(module.stage)
        if hf_start.is_post_training(params, stage):  # [#15] HF tensors vs the model, instruction files
            params = self._params(module)
            from primus.plan.model import ModelSpec

            hf_start.check_hf_inputs(params, ModelSpec(**params["model"]), prefix=prefix, provenance=provenance)
            loader = params.get("dataloader") or {}
            for key in ("dataset_path", "valid_dataset_path"):
                if stage == "sft" and loader.get(key) and not Path(loader[key]).expanduser().exists():
                    full = f"{prefix}.dataloader.{key}"
                    raise ConfigError(f"{provenance.describe(full)}: {full}: {loader[key]} does not exist")
        elif tiny_assets_dir(params) is not None:
            return  # built by prepare() before the ranks start
        dataloader = params.get("dataloader") or {}
        checks = [("hf_assets_path", Path(params.get("hf_assets_path", "./tests/assets/tokenizer")) / "tokenizer.json")]
        if dataloader.get("dataset_path"):
            checks.append(("dataloader.dataset_path", Path(dataloader["dataset_path"])))
        for key, path in checks:
            if not path.exists():
                full = f"{prefix}.{key}"
                raise ConfigError(f"{provenance.describe(full)}: {full}: {path} does not exist")

    def run(self, module: ModuleConfig, ctx: RunContext) -> None:
        from primus.backends.torchtitan.patches import apply_patches

        for name in apply_patches():
            ctx.logger.info("applied TorchTitan compatibility patch: %s", name)
        register_local_datasets()
        import torch.distributed as dist

        from primus.backends.torchtitan.config import build_trainer_config

        derived: list[tuple[str, Any, str]] = []
        params = self._params(module, derived)
        cfg, spec, more = build_trainer_config(params, run_dir=ctx.run_dir, device=ctx.device,
                                               prefix=f"modules.{module.name}", stage=self.canonical_stage(module.stage))
        hf_start.log_start(params, ctx.logger)
        for key, value, reason in [*derived, *more]:
            ctx.log_derived(key, value, reason)
        if ctx.resume and not cfg.checkpoint.enable:
            ctx.logger.warning("--resume given but checkpoint.enable is false: starting from step 0")
        trainer = cfg.build()
        seq_len = cfg.training.seq_len
        dp = trainer.parallel_dims.dp_replicate * trainer.parallel_dims.dp_shard
        global_batch = cfg.training.global_batch_size if cfg.training.global_batch_size > 0 \
            else cfg.training.local_batch_size * dp
        flops_per_token = dense_decoder_flops_per_token(n_layers=spec.n_layers, dim=spec.dim, seq_len=seq_len,
                                                        matmul_params=spec.matmul_params())
        _StepReporter(trainer, ctx, flops_per_token, global_batch * seq_len, seq_len)
        hf_start.tap_validation(trainer, ctx)  # [#15] [EVAL] lines
        try:
            trainer.train()
        finally:
            trainer.close()
            if dist.is_initialized():
                dist.destroy_process_group()

    def plan_inputs(self, module: ModuleConfig, world_size: int | None = None):
        """(ModelSpec, ParallelLayout) for ``primus plan`` / preflight's experiment checks."""
        from primus.backends.torchtitan.plan import plan_inputs

        return plan_inputs(module.params, world_size)
