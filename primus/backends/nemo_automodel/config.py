"""Module section -> the plain dict AutoModel's ``ConfigNode`` wraps.

Primus keys are stripped here (``PRIMUS_KEYS``) and the settings Primus owns are derived:
``model.mode`` from the stage, ``checkpoint.checkpoint_dir`` under the run dir, the resume
point, and the process-group backend. Everything else is AutoModel's own schema, checked by
``schema.check`` before it is handed over.
"""
from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from primus.config.errors import ConfigError

# Keys of ours that may sit in a module section; none of them may reach AutoModel.
PRIMUS_KEYS = frozenset({
    "stage", "framework", "config", "overrides", "tiny_assets", "trainable", "log_level", "logging",
    "sink_level", "file_sink_level", "stderr_sink_level", "primus", "metrics",
})
STAGE_TO_MODE = {"pretrain": "pretrain", "finetune": "finetune"}
EXPERTS = {"high_noise": "transformer", "low_noise": "transformer_2"}
_ENV = re.compile(r"\$\{(\w+)(?::([^}]*))?\}")


@dataclass
class Handoff:
    """What goes to AutoModel, and the Primus-only settings that were taken out of it."""

    automodel: dict[str, Any]
    primus: dict[str, Any]


def expand_path(value: str) -> str:
    """``${VAR:default}`` and ``~`` in a path (a no-op when the config engine already did it)."""
    value = _ENV.sub(lambda m: os.environ.get(m.group(1), m.group(2) or ""), str(value))
    return os.path.expanduser(value)


def tiny_assets_of(params: Mapping[str, Any]) -> str | None:
    """``primus.tiny_assets`` (the common Primus block), or the older top-level ``tiny_assets``."""
    block = params.get("primus")
    return (block.get("tiny_assets") if isinstance(block, Mapping) else None) or params.get("tiny_assets")


def split_primus_keys(params: Mapping[str, Any]) -> Handoff:
    automodel = copy.deepcopy(dict(params))
    primus = {key: automodel.pop(key) for key in list(automodel) if key in PRIMUS_KEYS}
    if isinstance(automodel.get("model"), str):  # an unresolved model-preset file name, not a section
        primus["model_preset"] = automodel.pop("model")
    return Handoff(automodel, primus)


def _section(cfg: dict[str, Any], name: str, where: Callable[[str], str] = lambda key: "") -> dict[str, Any]:
    node = cfg.setdefault(name, {})
    if node is None:
        node = cfg[name] = {}
    if not isinstance(node, dict):
        raise ConfigError(f"{where(name)}'{name}' must be a mapping, got {type(node).__name__}")
    return node


def build_handoff(
    params: Mapping[str, Any],
    *,
    stage: str,
    checkpoint_dir: Path,
    resume: bool,
    dist_backend: str,
    log_derived: Callable[[str, object, str], None],
    log: Callable[[str], None],
    where: Callable[[str], str] = lambda key: "",
) -> Handoff:
    """The AutoModel config for ``stage`` (already canonical), with Primus-owned fields set.
    ``where(key)`` is the ``file:line: `` prefix of an error about ``key``."""
    handoff = split_primus_keys(params)
    cfg = handoff.automodel
    model = _section(cfg, "model", where)

    mode = STAGE_TO_MODE[stage]
    if model.get("mode") not in (None, mode):
        raise ConfigError(f"{where('model.mode')}model.mode='{model['mode']}' contradicts stage '{stage}': the stage "
                          f"sets it, drop model.mode")
    model["mode"] = mode

    expert = model.get("stage")
    if expert is not None and str(expert).lower() not in EXPERTS:
        raise ConfigError(f"{where('model.stage')}model.stage='{expert}' must be one of {', '.join(EXPERTS)} "
                          f"(the Wan 2.2 expert to train)")

    if mode == "finetune" and model.get("pipeline_spec") is not None:
        model.pop("pipeline_spec")
        log("finetune loads pretrained weights: model.pipeline_spec is ignored")
    elif mode == "pretrain":
        spec = model.setdefault("pipeline_spec", {}) or {}
        model["pipeline_spec"] = spec
        if "transformer_cls" not in spec:
            spec["transformer_cls"] = "WanTransformer3DModel"
            log_derived("model.pipeline_spec.transformer_cls", spec["transformer_cls"], "pretrain needs a class")
        if "subfolder" not in spec:
            spec["subfolder"] = EXPERTS.get(str(expert).lower(), "transformer") if expert else "transformer"
            log_derived("model.pipeline_spec.subfolder", spec["subfolder"], "the trained expert's config")

    tiny = tiny_assets_of(handoff.primus)
    if tiny:
        root = Path(expand_path(tiny))
        handoff.primus["tiny_assets"] = root
        if not model.get("pretrained_model_name_or_path"):
            model["pretrained_model_name_or_path"] = str(root / "pipeline")
        loader = _section(_section(cfg, "data"), "dataloader")
        if not loader.get("cache_dir"):
            loader["cache_dir"] = str(root / "cache")
    if not model.get("pretrained_model_name_or_path"):
        raise ConfigError(f"{where('model')}model.pretrained_model_name_or_path is required (a local diffusers "
                          f"pipeline dir or hub id)")
    path = expand_path(model["pretrained_model_name_or_path"])
    if os.path.exists(path) or path.startswith((".", "/")):
        model["pretrained_model_name_or_path"] = path
    if expert is not None and model.get("boundary_ratio") is None:
        # AutoModel reads it from the loaded pipeline, which a pretrain run (transformer only) lacks.
        index = Path(model["pretrained_model_name_or_path"]) / "model_index.json"
        ratio = json.loads(index.read_text()).get("boundary_ratio") if index.exists() else None
        if ratio is not None:
            model["boundary_ratio"] = ratio
            log_derived("model.boundary_ratio", ratio, f"from {index}")
    for name in ("dataloader", "validation_dataloader"):
        loader = (cfg.get("data") or {}).get(name)
        if isinstance(loader, dict) and loader.get("cache_dir"):
            loader["cache_dir"] = expand_path(loader["cache_dir"])

    checkpoint = _section(cfg, "checkpoint")
    wanted = str(checkpoint_dir)
    if checkpoint.get("checkpoint_dir") not in (None, wanted):
        log_derived("checkpoint.checkpoint_dir", wanted, f"Primus keeps checkpoints in the run dir, not "
                                                         f"'{checkpoint['checkpoint_dir']}'")
    checkpoint["checkpoint_dir"] = wanted
    checkpoint.setdefault("enabled", True)
    if resume and not checkpoint.get("restore_from"):
        checkpoint["restore_from"] = "LATEST"

    dist_env = _section(cfg, "dist_env")
    if "backend" not in dist_env:
        dist_env["backend"] = dist_backend
        log_derived("dist_env.backend", dist_backend, "from the device")
    return handoff
