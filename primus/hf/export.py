"""A finished (or interrupted) run's checkpoint -> a Hugging Face model folder.

The run directory says everything needed: ``config.resolved.yaml`` names the backend, the model
and where it started from, and the checkpoint is read whole, whatever TP/PP/DP layout wrote it
(a Megatron ``torch_dist`` or TorchTitan DCP checkpoint stores each tensor's global shape; DCP
reassembles the shards). The result is ``config.json`` + ``*.safetensors`` + the tokenizer files,
which ``transformers.AutoModelForCausalLM.from_pretrained`` loads. When the run started from a
HF checkpoint its ``config.json`` is kept (only the dtype follows the weights), so a model goes
out exactly as it came in; otherwise it is written from the run's ``ModelSpec``.
"""
from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from primus.config.errors import ConfigError
from primus.hf.export_target import check_target, claimed, write_atomically
from primus.plan.model import ModelSpec
from primus.runtime.checkpoints import pick_checkpoint

Warn = Callable[[str], None]

DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class Exported:
    out_dir: Path
    checkpoint: Path
    step: int
    tensors: int


def read_dcp_tensors(path: Path, select: Callable[[str], bool]) -> dict[str, Any]:
    """Every selected tensor of a DCP checkpoint (Megatron torch_dist is DCP too), at its global shape."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = FileSystemReader(str(path))
    metadata = reader.read_metadata()
    state = {key: torch.empty(meta.size, dtype=meta.properties.dtype)
             for key, meta in metadata.state_dict_metadata.items()
             if isinstance(meta, TensorStorageMetadata) and select(key)}
    if not state:
        raise ConfigError(f"{path}: no model tensors in this checkpoint")
    with warnings.catch_warnings():  # "torch.distributed is ... uninitialized, assuming ... a single process": yes
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=reader, no_dist=True)
    return state


# -- Megatron ------------------------------------------------------------------------------------
def _plan(framework: str, run_dir: Path, name: str, section: dict[str, Any]):
    """The run's own plan, rebuilt from its resolved config (as each of its workers did)."""
    from primus.runtime.adapter import ModuleConfig
    from primus.runtime.registry import get_adapter

    adapter = get_adapter(framework)
    module = ModuleConfig(name, framework, adapter.canonical_stage(section.get("stage", "pretrain")), section["params"])
    return adapter.plan(module, None, run_dir=run_dir, device="cpu")


def _megatron(run_dir: Path, name: str, section: dict[str, Any], step: int | None, warn: Warn):
    """Megatron torch_dist: its tensors have the layout-free keys and global shapes of ``primus.hf.megatron``."""
    from primus.hf.megatron import megatron_to_hf

    plan = _plan("megatron", run_dir, name, section)
    step, path = pick_checkpoint(plan.checkpoint.directory, "megatron", step, warn=warn)
    from primus.backends.megatron.legacy_checkpoint import is_legacy

    if is_legacy(path):
        raise ConfigError(f"{path}: Megatron-LM's legacy layout (ckpt_format: torch); export reads torch_dist "
                          "checkpoints (resume the run for a step with ckpt_format: torch_dist)")
    source, spec = None, plan.model
    if plan.checkpoint.format == "hf":  # the HF model it started from: its config and unpadded vocabulary
        from primus.hf.config import model_spec_from_hf, read_config

        source = Path(plan.checkpoint.load)
        spec = model_spec_from_hf(read_config(source))
    tensors = read_dcp_tensors(path, lambda key: not key.startswith(("optimizer", "rng_state")))
    from primus.backends.megatron.lora import lora_of, merge_lora_tensors

    lora = lora_of(section["params"], f"modules.{name}")
    if lora is not None:  # W + (alpha / dim) * B @ A, as merge_lora does for AutoModel's PEFT adapters
        tensors = merge_lora_tensors(tensors, lora.scale)
    return megatron_to_hf(tensors, spec), spec, source, plan.engine_config.tokenizer_model, path, step


# -- TorchTitan ----------------------------------------------------------------------------------
_TORCHTITAN_STATE = ("optimizer", "lr_scheduler", "dataloader", "train_state")


def _torchtitan(run_dir: Path, name: str, section: dict[str, Any], step: int | None, warn: Warn):
    """Through the run's own plan: the model TorchTitan built and its own state-dict adapter's ``to_hf``."""
    plan = _plan("torchtitan", run_dir, name, section)
    step, path = pick_checkpoint(plan.checkpoint.directory, "torchtitan", step, warn=warn)
    titan = plan.engine_config.model_spec
    if titan.state_dict_adapter is None:
        raise ConfigError(f"{run_dir}: TorchTitan's {titan.name} model has no Hugging Face state-dict adapter")
    to_hf = titan.state_dict_adapter(titan.model, None).to_hf
    tensors = read_dcp_tensors(path, lambda key: not key.startswith(_TORCHTITAN_STATE))
    source = Path(plan.checkpoint.load) if plan.checkpoint.format == "hf" else None
    return to_hf(tensors), plan.model, source, plan.engine_config.hf_assets_path, path, step


# -- NeMo AutoModel (LLM recipe) ------------------------------------------------------------------
def merge_lora(base: dict[str, Any], adapter_dir: Path) -> dict[str, Any]:
    """``W + (alpha / r) * B @ A`` for every LoRA pair of a PEFT-format adapter (AutoModel's save)."""
    import json

    from safetensors.torch import load_file

    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    if config.get("use_dora"):
        raise ConfigError(f"{adapter_dir}: DoRA adapters cannot be merged by primus export")
    scale = config["lora_alpha"] / config["r"]
    adapter = load_file(str(adapter_dir / "adapter_model.safetensors"))
    merged = dict(base)
    for key, lora_a in adapter.items():
        if not key.endswith(".lora_A.weight"):
            continue
        name = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight") + ".weight"
        if name not in merged:
            raise ConfigError(f"{adapter_dir}: LoRA adapter for {name}, which the base model does not have")
        lora_b = adapter[key.replace(".lora_A.", ".lora_B.")]
        weight = merged[name]
        merged[name] = (weight.float() + scale * (lora_b.float() @ lora_a.float())).to(weight.dtype)
    return merged


def _automodel(run_dir: Path, name: str, section: dict[str, Any], step: int | None, warn: Warn):
    """AutoModel's LLM recipe: a PEFT adapter merged into its base model, or its consolidated weights."""
    from primus.hf.checkpoint import HFCheckpoint
    from primus.hf.config import model_spec_from_hf

    plan = _plan("nemo_automodel", run_dir, name, section)
    if plan.module.stage != "sft":
        raise ConfigError(f"{run_dir}: only AutoModel's LLM runs (stage sft) export to a Hugging Face LLM folder")
    source = Path(plan.engine_config["model"]["pretrained_model_name_or_path"])
    if not source.is_dir():
        raise ConfigError(f"{run_dir}: export needs the run's base model as a local folder (got {source})")
    root = plan.checkpoint.directory
    steps = {int(m.group(1)) + 1: p / "model" for p in root.glob("epoch_*_step_*")
             if (m := re.fullmatch(r"epoch_\d+_step_(\d+)", p.name)) and (p / "model").is_dir()}
    if not steps:
        raise ConfigError(f"{root}: no checkpoint in this run (was checkpointing on?)")
    step = max(steps) if step is None else step
    if step not in steps:
        raise ConfigError(f"--step {step}: no checkpoint of that step under {root} (steps: "
                          f"{', '.join(map(str, sorted(steps)))})")
    path = steps[step]
    base = HFCheckpoint(source)
    spec = model_spec_from_hf(base.config)
    if (path / "adapter_model.safetensors").exists():
        tensors = merge_lora(dict(base.tensors()), path)
    else:
        folder = path / "consolidated" if (path / "consolidated").is_dir() else path
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise ConfigError(f"{path}: no safetensors weights (set checkpoint.save_consolidated: true)")
        from safetensors.torch import load_file

        tensors = {}
        for file in files:
            tensors.update(load_file(str(file)))
    return tensors, spec, source, str(source), path, step


EXPORTERS = {"megatron": _megatron, "torchtitan": _torchtitan, "nemo_automodel": _automodel}


def _config(source: Path | None, spec: ModelSpec, dtype: str, tokenizer: str | None) -> dict[str, Any]:
    from primus.hf.config import hf_config_from_spec, read_config

    if source is not None:
        config = dict(read_config(source))
        config["dtype"] = dtype
        if "torch_dtype" in config:
            config["torch_dtype"] = dtype
        return config
    tokens = {}
    if tokenizer and Path(tokenizer).is_dir():
        from primus.data.sft import load_tokenizer

        loaded = load_tokenizer(tokenizer)
        tokens = {"bos_token_id": loaded.bos_token_id, "eos_token_id": loaded.eos_token_id,
                  "pad_token_id": loaded.pad_token_id}
    return hf_config_from_spec(spec, dtype=dtype, tokens=tokens)


def export_run(run_dir: str | Path, out_dir: str | Path, *, step: int | None = None, module: str | None = None,
               dtype: str | None = None, warn: Warn | None = None) -> Exported:
    """Write the run's checkpoint (latest whole one, or ``step``) as a HF model folder ``out_dir``
    (new or empty), atomically; a damaged newer checkpoint is skipped with ``warn``."""
    from primus.runtime.rundir import RunDir

    out = check_target(out_dir)  # before anything is read: a bad OUT_DIR costs nothing
    if step is not None and step < 0:
        raise ConfigError(f"--step {step}: a step is ≥ 0")
    run_dir = Path(run_dir).expanduser().absolute()
    name, section = RunDir(run_dir).read_module(module)
    framework = section["framework"]
    if framework not in EXPORTERS:
        raise ConfigError(f"{run_dir}: export from a {framework!r} run is not supported "
                          f"(supported: {', '.join(EXPORTERS)})")
    with claimed(out):
        hf, spec, source, tokenizer, path, step = EXPORTERS[framework](run_dir, name, section, step, warn)
        hf, config = _as_hf_model(hf, spec, source, tokenizer, path, dtype)
        from primus.hf.checkpoint import save_hf_checkpoint

        write_atomically(out, lambda folder: save_hf_checkpoint(folder, hf, config, tokenizer_from=source or tokenizer))
    return Exported(out, path, step, len(hf))


def _as_hf_model(hf: dict[str, Any], spec: ModelSpec, source: Path | None, tokenizer: str | None, path: Path,
                 dtype: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tensors a HF model of ``spec`` holds (cast to ``dtype``) and its ``config.json``."""
    import torch

    from primus.hf.checkpoint import expected_shapes

    expected = expected_shapes(spec)
    missing = sorted(set(expected) - set(hf))
    if missing:
        raise ConfigError(f"{path}: the checkpoint has no {missing[0]} ({len(missing)} tensors missing)")
    hf = {k: v for k, v in hf.items() if k in expected}
    if dtype is not None:
        hf = {k: v.to(getattr(torch, dtype)) for k, v in hf.items()}
    stored = str(next(iter(hf.values())).dtype).removeprefix("torch.")
    return hf, _config(source, spec, stored, tokenizer)
