"""AutoModel diffusion settings -> the (WanSpec, DiffusionLayout) pair ``primus plan`` and preflight
estimate (``primus.plan.diffusion``).

The transformer's shapes are not YAML keys in AutoModel: they live in the pipeline's
``transformer/config.json``. They are read from a local pipeline (a snapshot, or the tiny one
Primus builds), else from the published Wan 2.2 config by its Hub name, else from the tiny
pipeline's builder settings when ``primus.tiny_assets`` will build it. The sample shape comes
from the latent cache when it exists (frames, bucket resolution), else from
``data.dataloader.base_resolution`` and Wan's 81 frames; the tiny cache is described by its
builder's settings whether it is built yet or not (a plan is the same before and after ``prepare``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from primus.backends.nemo_automodel.config import EXPERTS
from primus.data.tiny_assets import tiny_assets_dir
from primus.plan.diffusion import (EXPERTS as KNOWN_EXPERTS, ClipShape, DiffusionLayout, WanSpec, known_name,
                                   known_transformer, unknown_model_error)

_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "fp32": "fp32", "bf16": "bf16"}


def _world_size(given: int | None) -> int:
    if given:
        return given
    if os.environ.get("WORLD_SIZE"):
        return int(os.environ["WORLD_SIZE"])
    return int(os.environ.get("GPUS_PER_NODE", "1")) * int(os.environ.get("NNODES", "1"))


def wan_spec(params: dict[str, Any]) -> WanSpec:
    model = params.get("model") or {}
    name = str(model.get("pretrained_model_name_or_path") or "")
    expert = EXPERTS.get(str(model.get("stage") or "high_noise").lower(), "transformer")
    local = Path(name).expanduser() if name else None
    root = tiny_assets_dir(params)
    if root is not None and (local is None or local.absolute() == root / "pipeline"):
        from primus.data.diffusion.tiny import TINY_TRANSFORMER  # the pipeline prepare builds, built yet or not

        return WanSpec.from_transformer_config(TINY_TRANSFORMER, experts=2, name=f"tiny Wan 2.2 ({expert})")
    if local is not None and (local / expert / "config.json").is_file():
        config = json.loads((local / expert / "config.json").read_text())
        experts = sum((local / sub / "config.json").is_file() for sub in EXPERTS.values()) or 1
        return WanSpec.from_transformer_config(config, experts=experts, name=f"{local.name} ({expert})")
    if known_transformer(name):
        return WanSpec.from_transformer_config(known_transformer(name), experts=KNOWN_EXPERTS.get(known_name(name), 1),
                                               name=f"{name} ({expert})")
    if tiny_assets_dir(params):
        from primus.data.diffusion.tiny import TINY_TRANSFORMER

        return WanSpec.from_transformer_config(TINY_TRANSFORMER, experts=2, name=f"tiny Wan 2.2 ({expert})")
    raise unknown_model_error("model.pretrained_model_name_or_path", name)


def clip_shape(params: dict[str, Any]) -> ClipShape:
    loader = (params.get("data") or {}).get("dataloader") or {}
    cache = loader.get("cache_dir")
    root = tiny_assets_dir(params)
    tiny_cache = root is not None and (not cache or Path(str(cache)).expanduser().absolute() == root / "cache")
    if cache and not tiny_cache:
        first = _first_cached_sample(Path(str(cache)).expanduser())
        if first is not None:
            width, height = first["bucket_resolution"]
            return ClipShape(int(width), int(height), int(first.get("num_frames", 81)), source=f"latent cache {cache}")
    width, height = loader.get("base_resolution") or (832, 480)
    if tiny_cache:  # the cache `primus.tiny_assets` builds (before the run or already): 9-frame clips
        return ClipShape(int(width), int(height), frames=9, source="the tiny latent cache Primus builds")
    return ClipShape(int(width), int(height), source="data.dataloader.base_resolution, Wan's 81 frames")


def _first_cached_sample(cache: Path) -> dict[str, Any] | None:
    try:
        shards = json.loads((cache / "metadata.json").read_text()).get("shards") or []
        entries = json.loads((cache / shards[0]).read_text()) if shards else []
    except (OSError, ValueError):
        return None
    return entries[0] if entries and "bucket_resolution" in entries[0] else None


def plan_inputs(params: dict[str, Any], world_size: int | None = None) -> tuple[WanSpec, DiffusionLayout]:
    fsdp = params.get("fsdp") or {}
    steps = params.get("step_scheduler") or {}
    model = params.get("model") or {}
    world = _world_size(world_size)
    other = (fsdp.get("tp_size") or 1) * (fsdp.get("cp_size") or 1) * (fsdp.get("pp_size") or 1)
    layout = DiffusionLayout(
        dp=fsdp.get("dp_size") or max(1, world // other),
        micro_batch_size=steps.get("local_batch_size") or 1,
        global_batch_size=steps.get("global_batch_size"),
        activation_checkpointing=bool(fsdp.get("activation_checkpointing", False)),
        param_dtype=_DTYPES.get(str(model.get("torch_dtype", "float32")), "fp32"),
        compute_dtype=_DTYPES.get(str(model.get("compute_dtype", "bfloat16")), "bf16"),
        prefetch=int(fsdp.get("fsdp2_forward_prefetch_depth", 1) if fsdp.get("enable_fsdp2_prefetch", True) else 0),
        compiled=bool(fsdp.get("enable_compile", False)),
        clip=clip_shape(params),
    )
    return wan_spec(params), layout


def plan_inputs_if_known(params: dict[str, Any], world_size: int | None = None):
    """``plan_inputs``, or (None, None) when the transformer's shapes are unknown: training a Hub
    model Primus has no config for needs no plan."""
    from primus.config.errors import ConfigError

    try:
        return plan_inputs(params, world_size)
    except ConfigError:
        return None, None
