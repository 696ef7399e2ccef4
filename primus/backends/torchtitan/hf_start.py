"""TorchTitan runs that start from a Hugging Face checkpoint and/or train on instruction data.

TorchTitan loads HF safetensors itself, through its model's state-dict adapter, when
``checkpoint.initial_load_in_hf`` is set (from ``checkpoint.initial_load_path``, else from
``hf_assets_path``). Primus adds what a user would otherwise get wrong silently:

* the ``model:`` block is read from the checkpoint's ``config.json`` when none is given;
* the initial load only happens with ``checkpoint.enable``: when it is off, checkpointing is
  switched on in ``load_only`` mode (reads, never writes) and said so;
* ``initial_load_path`` must be absolute for TorchTitan: a relative one is made absolute;
* before launch every HF tensor name and shape is checked against the model (one line, exit 2).

Any recipe may start from HF weights; the sft recipe also reads instruction data (``recipes/sft.py``).
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from primus.config.errors import ConfigError


def hf_source(params: dict[str, Any]) -> Path | None:
    """The HF folder TorchTitan will load weights from, or None when it loads none."""
    checkpoint = params.get("checkpoint") or {}
    if not checkpoint.get("initial_load_in_hf"):
        return None
    source = checkpoint.get("initial_load_path") or params.get("hf_assets_path")
    return Path(source).expanduser().absolute() if source else None


def with_hf_start(params: dict[str, Any], derived: list | None = None, *, prefix: str = "modules.pre_trainer",
                  tiny_root: Path | None = None) -> dict[str, Any]:
    """``params`` with the model read from the HF checkpoint and the checkpoint settings TorchTitan needs
    (a checkpoint ``primus.tiny_assets`` will build in ``tiny_root`` is read as the model it will be)."""
    source = hf_source(params)
    if source is None:
        return params
    note = derived.append if derived is not None else (lambda item: None)
    params = copy.deepcopy(params)
    checkpoint = params.setdefault("checkpoint", {})
    if checkpoint.get("initial_load_path") and checkpoint["initial_load_path"] != str(source):
        checkpoint["initial_load_path"] = str(source)
        note(("checkpoint.initial_load_path", str(source), "TorchTitan needs an absolute path"))
    if not checkpoint.get("enable"):
        checkpoint.update(enable=True, load_only=True)
        note(("checkpoint.load_only", True, "TorchTitan reads initial_load_path only with checkpointing on; "
                                            "checkpoint.enable is false, so nothing is saved"))
    if "model" not in params:
        from primus.hf.config import model_spec_from_hf
        from primus.hf.tiny import hf_config

        try:
            config = hf_config(source, tiny_root)
        except ConfigError:
            raise ConfigError(f"{prefix}.checkpoint.initial_load_path: {source} has no config.json (a Hugging Face "
                              "model folder), and no model preset describes the network") from None
        spec = model_spec_from_hf(config, f"{source}/config.json")
        if spec.qkv_bias or spec.qk_norm or spec.is_moe:
            raise ConfigError(f"{prefix}: {source} is a {spec.family} model; Primus builds TorchTitan's llama3 "
                              "(no Q/K/V biases, Q/K norms or experts): use framework: megatron for it")
        params["model"] = spec.model_dump(exclude_none=True)
        note(("model", f"{spec.family} {spec.n_layers}x{spec.dim}", f"from {source}/config.json"))
    return params


def check_hf_start(plan, provenance=None) -> None:
    """Before launch: the HF checkpoint's every tensor against the model TorchTitan will build (one line
    naming the tensor and both shapes on a mismatch)."""
    from primus.data.tiny_assets import built_by_prepare

    if plan.checkpoint.format != "hf" or built_by_prepare(plan.checkpoint.load, plan.module.params):
        return  # the tiny model is Primus's own
    from primus.hf.checkpoint import HFCheckpoint, check_against_spec

    named = "checkpoint.initial_load_path" if plan.engine_config.checkpoint.initial_load_path else "hf_assets_path"
    key = f"{plan.module.prefix}.{named}"
    where = f"{provenance.describe(key)}: {key}" if provenance is not None else key
    source = Path(plan.checkpoint.load)
    if not source.is_dir():
        raise ConfigError(f"{where}: {source} does not exist")
    check_against_spec(HFCheckpoint(source), plan.model, where)


def log_start(checkpoint, logger) -> None:
    if checkpoint.format == "hf":
        logger.info("starting from Hugging Face checkpoint %s (TorchTitan's state-dict adapter loads it)",
                    checkpoint.load)
