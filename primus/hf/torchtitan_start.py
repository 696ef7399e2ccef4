"""TorchTitan runs that start from a Hugging Face checkpoint and/or train on instruction data.

TorchTitan loads HF safetensors itself, through its model's state-dict adapter, when
``checkpoint.initial_load_in_hf`` is set (from ``checkpoint.initial_load_path``, else from
``hf_assets_path``). Primus adds what a user would otherwise get wrong silently:

* the ``model:`` block is read from the checkpoint's ``config.json`` when none is given;
* the initial load only happens with ``checkpoint.enable``: when it is off, checkpointing is
  switched on in ``load_only`` mode (reads, never writes) and said so;
* ``initial_load_path`` must be absolute for TorchTitan: a relative one is made absolute;
* before launch every HF tensor name and shape is checked against the model (one line, exit 2);
* ``stage: sft`` swaps the dataloader for ``primus.data.sft_torchtitan.SFTDataLoader`` and points
  the validator at its held-out split.
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


def is_post_training(params: dict[str, Any], stage: str) -> bool:
    return stage == "sft" or hf_source(params) is not None


def with_hf_start(params: dict[str, Any], stage: str, derived: list | None = None, *,
                  prefix: str = "modules.pre_trainer") -> dict[str, Any]:
    """``params`` with the model read from the HF checkpoint and the checkpoint settings TorchTitan needs."""
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
        from primus.hf.config import model_spec_from_hf, read_config

        if not (source / "config.json").is_file():
            raise ConfigError(f"{prefix}.checkpoint.initial_load_path: {source} has no config.json (a Hugging Face "
                              "model folder), and no model preset describes the network")
        spec = model_spec_from_hf(read_config(source), f"{source}/config.json")
        if spec.qkv_bias or spec.qk_norm or spec.is_moe:
            raise ConfigError(f"{prefix}: {source} is a {spec.family} model; Primus builds TorchTitan's llama3 "
                              "(no Q/K/V biases, Q/K norms or experts): use framework: megatron for it")
        params["model"] = spec.model_dump(exclude_none=True)
        note(("model", f"{spec.family} {spec.n_layers}x{spec.dim}", f"from {source}/config.json"))
    return params


def sft_dataloader_config():
    """A fresh ``SFTDataLoader.Config`` to put under ``Trainer.Config.dataloader`` before the keys apply."""
    from primus.data.sft_torchtitan import SFTDataLoader

    return SFTDataLoader.Config()


def finish_sft_config(cfg, attn_backend: str, fail) -> list[tuple[str, Any, str]]:
    """After the user's keys: the validator reads the held-out split; packing needs document-aware attention."""
    from dataclasses import replace

    loader = cfg.dataloader
    if not loader.dataset_path:
        raise fail("dataloader.dataset_path", "stage sft needs instruction data (a JSONL file or a folder of them)")
    if loader.packing and attn_backend == "sdpa":
        raise fail("dataloader.packing", "packed conversations need document-aware attention (attn_backend flex or "
                                         "varlen); causal SDPA would let them attend to each other. Use packing: "
                                         "false (one conversation per sequence, padded)")
    derived = []
    if cfg.validator.enable and not loader.valid_dataset_path and loader.valid_fraction <= 0:
        raise fail("validator.enable", "validation needs held-out instructions: dataloader.valid_fraction > 0 or "
                                       "dataloader.valid_dataset_path")
    if cfg.validator.enable:
        cfg.validator.dataloader = replace(loader, split="valid", infinite=cfg.validator.steps != -1)
        derived.append(("validator.dataloader", "the held-out instruction split", "stage sft"))
    return derived


def check_inputs(plan, *, provenance=None) -> None:
    """Before launch: the HF checkpoint's every tensor against the model TorchTitan will build, and the
    instruction files exist (one line naming the tensor and both shapes on a mismatch)."""
    module, cfg = plan.module, plan.engine_config
    prefix = f"modules.{module.name}"

    def where(key: str) -> str:
        full = f"{prefix}.{key}"
        return f"{provenance.describe(full)}: {full}" if provenance is not None else full

    if module.stage == "sft":
        from primus.data.sft import jsonl_files, record_files

        for key in ("dataset_path", "valid_dataset_path"):
            path = getattr(cfg.dataloader, key, None)
            if path and not Path(path).expanduser().exists():
                raise ConfigError(f"{where('dataloader.' + key)}: {path} does not exist")
            try:
                if path:
                    jsonl_files(path) if key == "dataset_path" else record_files(path)
            except ConfigError as exc:  # a folder without training records: say what it holds
                raise ConfigError(f"{where('dataloader.' + key)}: {exc}") from None
    if plan.checkpoint.format != "hf":
        return
    from primus.hf.checkpoint import HFCheckpoint, check_against_spec

    source = Path(plan.checkpoint.load)
    key = "checkpoint.initial_load_path" if cfg.checkpoint.initial_load_path else "hf_assets_path"
    if not source.is_dir():
        raise ConfigError(f"{where(key)}: {source} does not exist")
    check_against_spec(HFCheckpoint(source), plan.model, where(key))


def log_start(checkpoint, logger) -> None:
    if checkpoint.format == "hf":
        logger.info("starting from Hugging Face checkpoint %s (TorchTitan's state-dict adapter loads it)",
                    checkpoint.load)

