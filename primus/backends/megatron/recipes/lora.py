"""LoRA on Megatron, around the stage's own recipe (sft, or pretrain as AMD's LoRA benchmarks run it):
AMD Primus's ``lora:`` block, adapters on megatron-core's linears (``primus.backends.megatron.lora``),
every base weight frozen. The plan carries the adapters; the trainer adds them after the base weights
are loaded, and ``export`` merges them (``W + alpha/dim * B A``)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from primus.backends.megatron.lora import check_rank, lora_of
from primus.config.provenance import error_at
from primus.runtime.adapter import ModuleConfig, WrappingRecipe

if TYPE_CHECKING:
    from primus.backends.megatron.recipes.common import MegatronPlan
    from primus.config.provenance import Provenance
    from primus.plan.target import Target
    from primus.runtime.admission import Refusal


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
        check_rank(lora, plan.engine_config, module.prefix,
                   provenance.describe(f"{module.prefix}.lora") if provenance is not None else "")
        plan.lora = lora
        base = "" if module.params.get("hf_path") else " (no hf_path: the frozen base is megatron-core's random init)"
        plan.derive("lora", lora.describe(), f"adapters y = W x + {lora.scale:g} * B A x on megatron-core's linears "
                    f"(alpha / dim); every base weight frozen{base}")
        return plan

    def admit(self, plan: "MegatronPlan", target: "Target") -> "list[Refusal]":
        return super().admit(plan, target) + (lora_on_te_layers(plan.engine_config) if plan.lora is not None else [])


def lora_on_te_layers(args) -> "list[Refusal]":
    """LoRA wraps megatron-core's local linears; FP8 and context parallelism need Transformer Engine's layers."""
    from primus.backends.megatron.te_features import uses_context_parallel, uses_fp8
    from primus.runtime.admission import Refusal

    if uses_fp8(args) or uses_context_parallel(args):
        return [Refusal("lora", "lora", "LoRA wraps megatron-core's local linears, and FP8 / context parallelism "
                                        "need Transformer Engine's layers: drop one")]
    return []
