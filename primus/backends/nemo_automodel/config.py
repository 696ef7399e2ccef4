"""Module section -> the plain dict AutoModel's ``ConfigNode`` wraps.

Only the ``primus:`` block is Primus's own and is taken out; every other key is AutoModel's and is
checked by ``schema.check`` (an unknown one is an error with its file:line, never dropped). The
settings Primus owns are derived here, each said once: ``model.mode`` from the recipe, the
checkpoint directory under the run dir, the process-group backend from the device, and the paths
of the tiny demo assets. ``${VAR:default}`` was already resolved by the config engine.
"""
from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from primus.config.errors import ConfigError
from primus.data.tiny_assets import tiny_assets_dir
from primus.runtime.adapter import EnginePlan

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


def build_handoff(params: Mapping[str, Any], *, mode: str, weights: Callable[[dict[str, Any], EnginePlan], None],
                  checkpoint_dir: Path, dist_backend: str, plan: EnginePlan) -> dict[str, Any]:
    """AutoModel's config in ``mode`` (the recipe's: pretrain | finetune), the trained expert's weights
    set up by ``weights`` (``from_pipeline_spec`` | ``from_pretrained``), the Primus-owned fields set."""
    cfg = copy.deepcopy({key: value for key, value in params.items() if key != "primus"})
    model = _section(cfg, "model")
    _set_mode(model, mode, plan)
    weights(model, plan)
    root = tiny_assets_dir(dict(params))
    _point_at_tiny_assets(cfg, root)
    if not model.get("pretrained_model_name_or_path"):
        raise ConfigError("model.pretrained_model_name_or_path is required (a local diffusers pipeline dir or hub id)",
                          key="model.pretrained_model_name_or_path")
    _expand_user_paths(cfg)
    _boundary_ratio(model, plan, root)
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
        from primus.plan.devices import cpu_bf16_decision  # bf16 only on CPUs with bf16 units

        keep, reason = cpu_bf16_decision()
        if not keep:
            model["compute_dtype"] = plan.derive("model.compute_dtype", "float32", reason)
    return cfg


def _set_mode(model: dict[str, Any], mode: str, plan: EnginePlan) -> None:
    """``model.mode`` is the recipe's; the expert to train is one of Wan 2.2's two."""
    if model.get("mode") not in (None, mode):
        raise ConfigError(f"model.mode='{model['mode']}' contradicts stage '{mode}': the stage sets it, "
                          "drop model.mode", key="model.mode")
    model["mode"] = mode
    expert = model.get("stage")
    if expert is not None and str(expert).lower() not in EXPERTS:
        raise ConfigError(f"model.stage='{expert}' must be one of {', '.join(EXPERTS)} (the Wan 2.2 expert to train)",
                          key="model.stage")


def from_pipeline_spec(model: dict[str, Any], plan: EnginePlan) -> None:
    """Pretrain builds the trained expert from ``pipeline_spec`` (random init): its class and config."""
    expert = model.get("stage")
    spec = model.get("pipeline_spec") or {}
    model["pipeline_spec"] = spec
    if "transformer_cls" not in spec:
        spec["transformer_cls"] = plan.derive("model.pipeline_spec.transformer_cls", "WanTransformer3DModel",
                                              "pretrain needs a class")
    if "subfolder" not in spec:
        subfolder = EXPERTS.get(str(expert).lower(), "transformer") if expert else "transformer"
        spec["subfolder"] = plan.derive("model.pipeline_spec.subfolder", subfolder, "the trained expert's config")


def from_pretrained(model: dict[str, Any], plan: EnginePlan) -> None:
    """Finetune loads the pipeline's pretrained weights: a ``pipeline_spec`` is not read."""
    if model.pop("pipeline_spec", None) is not None:
        plan.derive("model.pipeline_spec", None, "finetune loads pretrained weights: pipeline_spec is not used")


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


def _boundary_ratio(model: dict[str, Any], plan: EnginePlan, tiny_root: Path | None) -> None:
    """AutoModel reads it from the loaded pipeline, which a pretrain run (transformer only) lacks.
    The tiny pipeline ``primus.tiny_assets`` will build has a known one (a plan builds nothing)."""
    if model.get("stage") is None or model.get("boundary_ratio") is not None:
        return
    index = Path(model["pretrained_model_name_or_path"]) / "model_index.json"
    ratio = json.loads(index.read_text()).get("boundary_ratio") if index.exists() else None
    if ratio is None and tiny_root is not None and index.parent == tiny_root / "pipeline":
        from primus.data.diffusion.tiny import BOUNDARY_RATIO

        ratio = BOUNDARY_RATIO
    if ratio is not None:
        model["boundary_ratio"] = plan.derive("model.boundary_ratio", ratio, f"from {index}")
