"""Module section -> the plain dict AutoModel's ``ConfigNode`` wraps.

Only the ``primus:`` block is Primus's own and is taken out; every other key is AutoModel's and is
checked by ``schema.check`` (an unknown one is an error with its file:line, never dropped). The
settings Primus owns are derived here, each said once: ``model.mode`` from the stage, the
checkpoint directory under the run dir, the process-group backend from the device, and the paths
of the tiny demo assets. ``${VAR:default}`` was already resolved by the config engine.
"""
from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from primus.config.errors import ConfigError
from primus.data.tiny_assets import tiny_assets_dir
from primus.runtime.adapter import EnginePlan

STAGE_TO_MODE = {"pretrain": "pretrain", "finetune": "finetune"}
EXPERTS = {"high_noise": "transformer", "low_noise": "transformer_2"}


def _section(cfg: dict[str, Any], dotted: str) -> dict[str, Any]:
    node = cfg
    for name in dotted.split("."):
        child = node.get(name)
        if child is None:
            child = node[name] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"'{dotted}' must be a mapping, got {type(child).__name__}", key=dotted)
        node = child
    return node


def build_handoff(params: Mapping[str, Any], *, stage: str, checkpoint_dir: Path, dist_backend: str,
                  plan: EnginePlan) -> dict[str, Any]:
    """AutoModel's config for ``stage`` (already canonical), with the Primus-owned fields set."""
    cfg = copy.deepcopy({key: value for key, value in params.items() if key != "primus"})
    model = _section(cfg, "model")
    _set_mode(model, stage, plan)
    _point_at_tiny_assets(cfg, tiny_assets_dir(dict(params)))
    if not model.get("pretrained_model_name_or_path"):
        raise ConfigError("model.pretrained_model_name_or_path is required (a local diffusers pipeline dir or hub id)",
                          key="model.pretrained_model_name_or_path")
    _expand_user_paths(cfg)
    _boundary_ratio(model, plan)
    checkpoint = _section(cfg, "checkpoint")
    if checkpoint.get("checkpoint_dir") not in (None, str(checkpoint_dir)):
        plan.derive("checkpoint.checkpoint_dir", str(checkpoint_dir),
                    f"Primus keeps checkpoints in the run dir, not '{checkpoint['checkpoint_dir']}'")
    checkpoint["checkpoint_dir"] = str(checkpoint_dir)
    checkpoint.setdefault("enabled", True)
    dist_env = _section(cfg, "dist_env")
    if "backend" not in dist_env:
        dist_env["backend"] = plan.derive("dist_env.backend", dist_backend, "from the device")
    if dist_backend == "gloo" and str(model.get("compute_dtype", "bfloat16")).lower() in ("bfloat16", "bf16"):
        from primus.plan.devices import cpu_bf16_decision  # perf (#17): bf16 only on CPUs with bf16 units

        keep, reason = cpu_bf16_decision()
        if not keep:
            model["compute_dtype"] = plan.derive("model.compute_dtype", "float32", reason)
    return cfg


def _set_mode(model: dict[str, Any], stage: str, plan: EnginePlan) -> None:
    """``model.mode`` follows the stage; pretrain builds the trained expert from ``pipeline_spec``."""
    mode = STAGE_TO_MODE[stage]
    if model.get("mode") not in (None, mode):
        raise ConfigError(f"model.mode='{model['mode']}' contradicts stage '{stage}': the stage sets it, "
                          "drop model.mode", key="model.mode")
    model["mode"] = mode
    expert = model.get("stage")
    if expert is not None and str(expert).lower() not in EXPERTS:
        raise ConfigError(f"model.stage='{expert}' must be one of {', '.join(EXPERTS)} (the Wan 2.2 expert to train)",
                          key="model.stage")
    if mode == "finetune":
        if model.pop("pipeline_spec", None) is not None:
            plan.derive("model.pipeline_spec", None, "finetune loads pretrained weights: pipeline_spec is not used")
        return
    spec = model.get("pipeline_spec") or {}
    model["pipeline_spec"] = spec
    if "transformer_cls" not in spec:
        spec["transformer_cls"] = plan.derive("model.pipeline_spec.transformer_cls", "WanTransformer3DModel",
                                              "pretrain needs a class")
    if "subfolder" not in spec:
        subfolder = EXPERTS.get(str(expert).lower(), "transformer") if expert else "transformer"
        spec["subfolder"] = plan.derive("model.pipeline_spec.subfolder", subfolder, "the trained expert's config")


def _point_at_tiny_assets(cfg: dict[str, Any], root: Path | None) -> None:
    """``primus.tiny_assets``: the tiny pipeline and latent cache, where the user left the paths unset."""
    if root is None:
        return
    model = cfg["model"]
    if not model.get("pretrained_model_name_or_path"):
        model["pretrained_model_name_or_path"] = str(root / "pipeline")
    loader = _section(cfg, "data.dataloader")
    if not loader.get("cache_dir"):
        loader["cache_dir"] = str(root / "cache")


def _expand_user_paths(cfg: dict[str, Any]) -> None:
    model = cfg["model"]
    path = os.path.expanduser(str(model["pretrained_model_name_or_path"]))
    if os.path.exists(path) or path.startswith((".", "/")):
        model["pretrained_model_name_or_path"] = path  # a local directory, not a hub id
    for name in ("dataloader", "validation_dataloader"):
        loader = (cfg.get("data") or {}).get(name)
        if isinstance(loader, dict) and loader.get("cache_dir"):
            loader["cache_dir"] = os.path.expanduser(str(loader["cache_dir"]))


def _boundary_ratio(model: dict[str, Any], plan: EnginePlan) -> None:
    """AutoModel reads it from the loaded pipeline, which a pretrain run (transformer only) lacks."""
    if model.get("stage") is None or model.get("boundary_ratio") is not None:
        return
    index = Path(model["pretrained_model_name_or_path"]) / "model_index.json"
    ratio = json.loads(index.read_text()).get("boundary_ratio") if index.exists() else None
    if ratio is not None:
        model["boundary_ratio"] = plan.derive("model.boundary_ratio", ratio, f"from {index}")
