"""megatron-core's patches, one list: CPU shims, upstream bugs on every device, then what a run option asks for.

The functions live in ``cpu_patches.py`` (CPU shims, device-independent fixes), ``fsdp_patches.py``
(PyTorch FSDP2) and ``option_patches.py`` (run options); each docstring gives the reason. A run applies
the records through one ``Patcher`` (``recipes/common.py``), for what its section uses (``params_uses``),
and undoes them when it ends.
"""
from __future__ import annotations

from typing import Any

from packaging.specifiers import SpecifierSet

from primus.backends.megatron import cpu_patches as cpu
from primus.backends.megatron import fsdp_patches as fsdp
from primus.backends.megatron import lazy_fusions
from primus.backends.megatron import option_patches as option
from primus.runtime.patches import ALWAYS, NO_GPU, PERMANENT, Condition, Patch, Swaps, Where, apply_for_process, uses

ENGINE = "megatron"
# Verified against megatron-core 0.16.1; the hard-coded CUDA sites are the same across 0.16.x.
MEGATRON_CORE = SpecifierSet(">=0.16.0,<0.17")
SANITIZE_NAN_GRADS = uses("sanitize_nan_grads", "the run sets primus.sanitize_nan_grads (AMD Primus: "
                                                "sft_sanitize_nan_grads)")


def _patch(function, why: str, when: Condition) -> Patch:
    return Patch(function.__name__, why, "megatron-core", MEGATRON_CORE, when, function)


def patch_lazy_fusion_compile(swap: Swaps = PERMANENT) -> None:
    """megatron-core's fusions compile on first call (``lazy_fusions``). It acts when megatron-core is first
    imported, so ``primus.backends.megatron`` calls this when imported; a run's ``Patcher`` finds it in place
    (nothing to undo: the finder is inert after that import)."""
    lazy_fusions.install(LAZY_FUSION_COMPILE)


LAZY_FUSION_COMPILE = _patch(patch_lazy_fusion_compile, "megatron-core's jit_fuser imports TorchDynamo and "
                             "Inductor at import (about 2.5 s of CPU per process); compile on first call", NO_GPU)

PATCHES = [
    LAZY_FUSION_COMPILE,
    _patch(cpu.patch_current_device, "megatron-core allocates on torch.cuda.current_device()", NO_GPU),
    _patch(cpu.patch_rng_tracker, "the TP/DP RNG streams live in CUDA generators", NO_GPU),
    _patch(cpu.patch_recompute_rng, "activation recompute saves and restores the CUDA RNG state", NO_GPU),
    _patch(cpu.patch_cuda_device_arguments, "optimizer, DDP and schedules create tensors with device='cuda'",
           NO_GPU),
    _patch(cpu.patch_param_type_checks, "grad clipping and the optimizers check 'torch.cuda.*' type names",
           NO_GPU),
    _patch(cpu.patch_moe_router_gemm_name, "the MoE router reads te_general_gemm, undefined without TE", NO_GPU),
    _patch(cpu.patch_alltoall_dispatcher_without_cuda_streams, "the alltoall token dispatcher makes a CUDA "
           "stream and event", NO_GPU),
    _patch(cpu.patch_cpu_expert_init_across_ep_ranks, "CPU initialisation gives every EP rank the same experts",
           NO_GPU),
    _patch(cpu.patch_torch_fsdp2_cpu_mesh, "megatron-core's FSDP2 wrapper builds a 'cuda' device mesh", NO_GPU),
    _patch(cpu.patch_checkpoint_results_queue_by_fork, "the torch_dist writer's results queue lives in a spawned "
           "Manager that imports torch on a rank's first save (about 4 s)", NO_GPU),
    _patch(cpu.patch_identity_reduce_for_single_rank_groups, "a one-rank TP all-reduce returns a view that MoE "
           "bias experts modify in place", ALWAYS),
    _patch(cpu.patch_local_attention_mla_head_dims, "the local DotProductAttention rejects MLA's k/v_channels",
           ALWAYS),
    _patch(cpu.patch_mla_without_transformer_engine, "MLA believes Transformer Engine is installed when it is not",
           ALWAYS),
    _patch(cpu.patch_torch_norm_sequence_parallel, "the torch norm refuses sequence parallelism", ALWAYS),
    _patch(cpu.patch_distrib_optimizer_legacy_load_with_torch_adam, "a legacy distrib_optim.pt does not load "
           "into torch's Adam (KeyError 'step')", ALWAYS),
    _patch(fsdp.patch_fsdp2_finish_grad_sync_signature, "FSDP2's finish_grad_sync lacks force_all_reduce "
           "(fixed upstream, Megatron-LM#4953)", ALWAYS),
    _patch(fsdp.patch_fsdp2_optimizer_param_identity, "with torch >= 2.13 FSDP2 checkpoints match no parameter "
           "ids", ALWAYS),
    _patch(fsdp.patch_fsdp2_swiglu_checkpoint_layout, "FSDP2 saves SwiGLU's linear_fc1 rows in the wrong place "
           "(fixed upstream, Megatron-LM#5714)", ALWAYS),
    _patch(option.sanitize_nan_grads, "NaN/Inf gradient elements become 0 before megatron-core's grad check and "
           "DP reduction", SANITIZE_NAN_GRADS),
]


def params_uses(params: dict[str, Any]) -> frozenset[str]:
    """What a run's module section asks of the patches: ``sanitize_nan_grads`` when ``primus.sanitize_nan_grads``
    is on (the run's ``Patcher`` and ``primus patches EXP`` read it alike)."""
    return frozenset({"sanitize_nan_grads"}) if (params.get("primus") or {}).get("sanitize_nan_grads") else frozenset()


def apply_patches(gpu: bool | None = None) -> list[str]:
    """Apply what is needed in this process for good (scripts and tests that build megatron-core outside a run);
    ``gpu`` as the run would see it (default: this host)."""
    where = Where.here(()) if gpu is None else Where(gpu, uses=frozenset())
    return apply_for_process(PATCHES, where)
