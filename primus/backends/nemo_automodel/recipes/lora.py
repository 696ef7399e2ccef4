"""LoRA with AutoModel's LLM recipe (``peft:``, its ``PeftConfig``), around the sft recipe: AutoModel
trains the adapters, and ``export`` merges them into the base weights (``W + alpha/r * B A``) as a
plain Hugging Face model. (A ``peft:`` block of the diffusion recipe is AutoModel's own business.)"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from primus.backends.nemo_automodel.recipes.sft import base_model, saved_model
from primus.config.errors import ConfigError
from primus.runtime.adapter import EnginePlan, HFWeights, WrappingRecipe


class AutoModelLoRA(WrappingRecipe):
    stage = "lora"

    def export(self, plan: EnginePlan, step: int | None, warn: Callable[[str], None] | None = None) -> HFWeights:
        """The saved PEFT adapter merged into the base model the run started from."""
        from primus.hf.checkpoint import HFCheckpoint

        source, step, path = saved_model(plan, step)
        tensors = merge_lora(dict(HFCheckpoint(source).tensors()), path)
        return HFWeights(tensors, base_model(source), source, str(source), path, step)


def merge_lora(base: dict[str, Any], adapter_dir: Path) -> dict[str, Any]:
    """``W + (alpha / r) * B @ A`` for every LoRA pair of a PEFT-format adapter (AutoModel's save)."""
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
