"""What NeMo AutoModel 0.7.0's ``TrainDiffusionRecipe`` reads, so unknown keys fail before launch.

AutoModel itself ignores keys it does not read (a typo in ``flow_matching`` silently trains
with the default). The key lists below come from reading ``recipes/diffusion/train.py`` and
``recipes/_typed_config.py`` of 0.7.0; sections backed by a dataclass or a ``_target_`` are
checked against that dataclass's fields or the target's signature (like ``tune validate``).
``tests/backends/nemo_automodel/test_config.py`` re-reads the recipe source to catch drift.
"""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from primus.config.errors import ConfigError, did_you_mean

TOP_LEVEL = frozenset({
    "recipe", "seed", "dist_env", "model", "step_scheduler", "lr_scheduler", "data", "optimizer",
    "clip_grad_norm", "flow_matching", "fsdp", "ddp", "checkpoint", "peft", "wandb", "performance",
})
MODEL = frozenset({
    "pretrained_model_name_or_path", "mode", "stage", "boundary_ratio", "torch_dtype", "compute_dtype",
    "attention_backend", "pipeline_spec", "model_type", "backend", "config_overrides", "cache_dir",
    "fuse_qkv_projections", "compact_fused_qkv_projections", "optimize_hunyuan_flash_varlen_mask",
    "transformer_engine_linear", "transformer_engine_fp8", "transformer_engine_fp8_recipe",
    "transformer_engine_fp8_amax_history_len", "transformer_engine_fp8_amax_compute_algo",
})
FLOW_MATCHING = frozenset({
    "adapter_type", "adapter_kwargs", "timestep_sampling", "logit_mean", "logit_std", "flow_shift",
    "mix_uniform_ratio", "beta_alpha", "beta_beta", "use_sigma_noise", "sigma_min", "sigma_max",
    "num_train_timesteps", "i2v_prob", "cfg_dropout_prob", "use_loss_weighting", "loss_weighting_scheme",
    "log_interval", "summary_log_interval",
})
FLAT = {
    "dist_env": frozenset({"backend", "timeout_minutes"}),
    "clip_grad_norm": frozenset({"max_norm"}),
    "performance": frozenset({"check_loss", "grad_clip_foreach"}),
    "data": frozenset({"dataloader", "validation_dataloader"}),
    "model": MODEL,
    "flow_matching": FLOW_MATCHING,
}
# Keys the diffusion mesh builder / distributed parser consume before the FSDP2Config dataclass.
_FSDP_EXTRA = frozenset({"tp_size", "pp_size", "cp_size", "ep_size", "dp_size", "dp_replicate_size", "cpu_offload",
                         "reduce_dtype", "cp_ring_degree", "cp_ulysses_degree", "backend", "use_hf_tp_plan",
                         "pipeline", "moe"})
# Runtime-owned fields that the recipe fills itself; setting them in YAML would be overwritten.
_CHECKPOINT_DERIVED = frozenset({"model_repo_id", "model_cache_dir", "is_peft", "model_state_dict_keys"})
DIFFUSION_DATALOADERS = {
    "nemo_automodel.components.datasets.diffusion.build_video_multiresolution_dataloader":
        "nemo_automodel.components.datasets.diffusion.collate_fns.TextToVideoDataloaderConfig",
    "nemo_automodel.components.datasets.diffusion.collate_fns.build_video_multiresolution_dataloader":
        "nemo_automodel.components.datasets.diffusion.collate_fns.TextToVideoDataloaderConfig",
    "nemo_automodel.components.datasets.diffusion.build_text_to_image_multiresolution_dataloader":
        "nemo_automodel.components.datasets.diffusion.collate_fns.TextToImageDataloaderConfig",
    "nemo_automodel.components.datasets.diffusion.collate_fns.build_text_to_image_multiresolution_dataloader":
        "nemo_automodel.components.datasets.diffusion.collate_fns.TextToImageDataloaderConfig",
    "nemo_automodel.components.datasets.diffusion.mock_dataloader.build_mock_dataloader":
        "nemo_automodel.components.datasets.diffusion.mock_dataloader.MockWanDataloaderConfig",
}


def _field_names(dotted_class: str) -> frozenset[str]:
    from nemo_automodel.components.config.loader import _resolve_target

    return frozenset(f.name for f in dataclasses.fields(_resolve_target(dotted_class)))


def dataclass_sections() -> dict[str, frozenset[str]]:
    """Sections whose keys are a dataclass's fields (plus what the recipe consumes around it)."""
    return {
        "fsdp": _field_names("nemo_automodel.components.distributed.config.FSDP2Config") | _FSDP_EXTRA,
        "ddp": _field_names("nemo_automodel.components.distributed.config.DDPConfig") | {"backend"},
        "step_scheduler": _field_names("nemo_automodel.components.training.step_scheduler.StepSchedulerConfig")
        | {"local_batch_size"},
        "lr_scheduler": _field_names("nemo_automodel.components.optim.optimizer.LRSchedulerConfig"),
        "checkpoint": (_field_names("nemo_automodel.components.checkpoint.config.CheckpointingConfig")
                       - _CHECKPOINT_DERIVED) | {"restore_from"},
        "model.pipeline_spec": _field_names("nemo_automodel._diffusers.auto_diffusion_pipeline.PipelineSpec"),
    }


def _unknown(where: str, keys: Iterable[str], allowed: Iterable[str], describe: Callable[[str], str]) -> list[ConfigError]:
    allowed = sorted(allowed)
    errors = []
    for key in keys:
        if key not in allowed:
            dotted = f"{where}.{key}" if where else key
            errors.append(ConfigError(f"{describe(dotted)}unknown AutoModel key '{dotted}'{did_you_mean(key, allowed)}",
                                      key=dotted))
    return errors


def resolve_target(path: Any, where: str, describe: Callable[[str], str]) -> Any:
    """A ``_target_`` through AutoModel's own allow-listed resolver."""
    from nemo_automodel.components.config.loader import _resolve_target

    try:
        return _resolve_target(path)
    except (ImportError, AssertionError) as exc:
        raise ConfigError(f"{describe(where)}{where}._target_ '{path}' cannot be imported: {exc}") from None


def check_target_kwargs(where: str, section: Mapping[str, Any], describe: Callable[[str], str]) -> list[ConfigError]:
    """Bind a ``_target_`` section's kwargs to the target's signature without calling it."""
    target = resolve_target(section["_target_"], where, describe)
    kwargs = {k: v for k, v in section.items() if k != "_target_"}
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return []  # builtins without a signature: nothing to check
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return []
    names = [p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL and p.name != "self"]
    return _unknown(where, kwargs, names, describe)


def check(cfg: Mapping[str, Any], describe: Callable[[str], str] = lambda key: "") -> None:
    """Raise one ``ConfigError`` listing every key AutoModel would not read."""
    errors = _unknown("", cfg, TOP_LEVEL, describe)
    for name, allowed in FLAT.items():
        if isinstance(cfg.get(name), Mapping):
            errors += _unknown(name, cfg[name], allowed, describe)
    for dotted, allowed in dataclass_sections().items():
        node: Any = cfg
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if isinstance(node, Mapping):
            errors += _unknown(dotted, node, allowed, describe)
    for name in ("optimizer", "peft"):
        section = cfg.get(name)
        if isinstance(section, Mapping) and "_target_" in section:
            errors += check_target_kwargs(name, section, describe)
    for name in ("dataloader", "validation_dataloader"):
        section = (cfg.get("data") or {}).get(name)
        if isinstance(section, Mapping):
            errors += _check_dataloader(f"data.{name}", section, describe)
    if errors:
        raise ConfigError.of_all(errors)


def _check_dataloader(where: str, section: Mapping[str, Any], describe: Callable[[str], str]) -> list[ConfigError]:
    target = section.get("_target_")
    if target is None:
        return [ConfigError(f"{describe(where)}{where}._target_ is required "
                            f"(e.g. {next(iter(DIFFUSION_DATALOADERS))})", key=f"{where}._target_")]
    config_class = DIFFUSION_DATALOADERS.get(str(target))
    if config_class is None:
        return check_target_kwargs(where, section, describe)
    return _unknown(where, [k for k in section if k != "_target_"], _field_names(config_class), describe)
