"""LoRA on Megatron, around the stage's own recipe (sft, or pretrain as AMD's LoRA benchmarks run it):
AMD Primus's ``lora:`` block, adapters on megatron-core's linears (``primus.backends.megatron.lora``),
every base weight frozen. The plan carries the adapters; the trainer adds them after the base weights
are loaded, and ``export`` merges them (``W + alpha/dim * B A``)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from primus.backends.megatron.lora import lora_of
from primus.config.provenance import error_at
from primus.runtime.adapter import ModuleConfig, WrappingRecipe

if TYPE_CHECKING:
    from primus.backends.megatron.recipes.common import MegatronPlan
    from primus.config.provenance import Provenance


class MegatronLoRA(WrappingRecipe):
    stage = "lora"

    def plan(self, module: ModuleConfig, world_size: int | None, provenance: "Provenance | None" = None, *,
             run_dir: Path | None = None, device: str = "cpu") -> "MegatronPlan":
        """The stage's plan plus the adapters; LoRA needs no sequence parallelism. With or without ``hf_path``
        (AMD's 4-layer LoRA benchmarks adapt a randomly initialised base: the plan says so)."""
        plan = super().plan(module, world_size, provenance, run_dir=run_dir, device=device)
        lora = lora_of(module.params, module.prefix, provenance)
        if lora is None:  # `enabled: false` after all (a block the dispatch could not read is checked here)
            plan.recipe = self.base
            return plan
        if plan.engine_config.sequence_parallel:
            raise error_at(provenance, f"{module.prefix}.lora",
                           "LoRA with sequence_parallel is not supported yet (set sequence_parallel: false)")
        plan.lora = lora
        base = "" if module.params.get("hf_path") else " (no hf_path: the frozen base is megatron-core's random init)"
        plan.derive("lora", lora.describe(), f"adapters y = W x + {lora.scale:g} * B A x on megatron-core's linears "
                    f"(alpha / dim); every base weight frozen{base}")
        return plan
