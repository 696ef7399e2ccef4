"""Megatron-LM arguments that run only on Transformer Engine's layers on a GPU: FP8 training and
context parallelism.

megatron-core runs FP8 inside Transformer Engine's modules (``fp8_autocast`` around each layer,
``megatron.core.fp8_utils.get_fp8_context``; its local layers have no FP8), and splits attention
over a context-parallel group only in ``TEDotProductAttention`` (its local ``DotProductAttention``
asserts ``context_parallel_size == 1``). So these arguments are admitted where the run's target
has a GPU with Transformer Engine (and, for FP8, the recipe's hardware), refused elsewhere with
the reason. ``refusal(args, given, target)`` is the one predicate; the launcher's admission and
each rank call it with the target they run for.

Recipe hardware, as Transformer Engine checks it (``transformer_engine/pytorch/quantization.py``:
NVIDIA/TransformerEngine 2.x ``check_fp8_support`` / ``check_mxfp8_support`` /
``check_fp8_block_scaling_support``; ROCm/TransformerEngine 030b792 the same functions for HIP):
delayed and tensorwise (current scaling) on NVIDIA SM 8.9+ and AMD gfx942/gfx950; blockwise on
NVIDIA SM 9.0+ with CUDA 12.9+, not on ROCm ("FP8 block scaled gemm not yet supported for
ROCm"); mxfp8 on NVIDIA SM 10.x (not 12.0) and AMD gfx950 (with ``NVTE_ROCM_ENABLE_MXFP8=1``).
"""
from __future__ import annotations

from typing import Any

from primus.plan.target import Target, has_fp8_gemm

# Read by megatron-core only when fp8 is set / context_parallel_size > 1 (otherwise: no effect).
FP8_ARGS = ("fp8_recipe", "fp8_margin", "fp8_interval", "fp8_amax_history_len", "fp8_amax_compute_algo",
            "fp8_wgrad", "fp8_param_gather", "first_last_layers_bf16", "num_layers_at_start_in_bf16",
            "num_layers_at_end_in_bf16")
CP_ARGS = ("cp_comm_type", "hierarchical_context_parallel_sizes")
TE_ARGS = ("fp8", *FP8_ARGS, "context_parallel_size", *CP_ARGS)

# recipe -> accelerator -> (lowest, first excluded) compute capability; absent: not on that vendor
RECIPE_HARDWARE: dict[str, dict[str, tuple[tuple[int, int], tuple[int, int]]]] = {
    "delayed": {"cuda": ((8, 9), (99, 0)), "rocm": ((9, 4), (99, 0))},
    "tensorwise": {"cuda": ((8, 9), (99, 0)), "rocm": ((9, 4), (99, 0))},
    "blockwise": {"cuda": ((9, 0), (99, 0))},
    "mxfp8": {"cuda": ((10, 0), (12, 0)), "rocm": ((9, 5), (99, 0))},
}
RECIPE_NEEDS = {
    "delayed": "NVIDIA SM 8.9+ or AMD gfx942+", "tensorwise": "NVIDIA SM 8.9+ or AMD gfx942+",
    "blockwise": "NVIDIA SM 9.0+ with CUDA 12.9+ (Transformer Engine has no ROCm kernels for it)",
    "mxfp8": "NVIDIA SM 10.x (B200) or AMD gfx950 (MI355X, NVTE_ROCM_ENABLE_MXFP8=1)",
}
# megatron-core 0.16.1's get_fp8_recipe: the Transformer Engine version each recipe needs
RECIPE_TE_VERSION = {"tensorwise": "2.2.0.dev0", "blockwise": "2.3.0.dev0", "mxfp8": "2.1.0"}


def uses_fp8(args) -> bool:
    return args.fp8 is not None


def uses_context_parallel(args) -> bool:
    return args.context_parallel_size > 1


def refusal(args, given: set[str], target: Target) -> tuple[str, str] | None:
    """``(argument, reason)`` for the first Transformer-Engine-only setting ``target`` cannot run;
    None when every one the experiment set can run there."""
    if uses_fp8(args) and "fp8" in given:
        reason = _te_layers_refusal(args, target, "FP8 training runs in Transformer Engine's layers on a GPU; "
                                                  "megatron-core's local layers have no FP8", "megatron.fp8")
        if reason:
            return "fp8", reason
        reason = _recipe_refusal(args, target)
        if reason:
            return "fp8_recipe", reason
        if args.fp8_param_gather and not (args.use_distributed_optimizer or args.use_torch_fsdp2
                                          or args.use_megatron_fsdp):
            return "fp8_param_gather", ("needs use_distributed_optimizer, use_torch_fsdp2 or use_megatron_fsdp "
                                        "(Megatron-LM's rule)")
    if uses_context_parallel(args) and "context_parallel_size" in given:
        reason = _te_layers_refusal(args, target, "context parallelism splits attention in Transformer "
                                                  "Engine's TEDotProductAttention on a GPU; megatron-core's "
                                                  "local attention refuses it", "megatron.context_parallel")
        if reason:
            return "context_parallel_size", reason
        if "a2a+p2p" in args.cp_comm_type and not args.hierarchical_context_parallel_sizes:
            return "cp_comm_type", "a2a+p2p needs hierarchical_context_parallel_sizes (Megatron-LM's rule)"
    return None


def _te_layers_refusal(args, target: Target, what: str, feature: str) -> str | None:
    """``feature``'s row of ``primus.runtime.capabilities`` decides the target (a GPU with Transformer Engine)."""
    from primus.runtime.capabilities import INSTALL_TE, missing

    lack = missing(feature, target)
    if lack == "gpu":
        return what
    if lack == "transformer_engine":
        return f"{what}; Transformer Engine is not importable here ({INSTALL_TE})"
    if lack == "nowhere":
        return f"{what}; not wired in Primus"
    if args.transformer_impl == "local":
        return f"{what}; transformer_impl is local (set transformer_engine)"
    return None


def _recipe_refusal(args, target: Target) -> str | None:
    recipe = args.fp8_recipe
    if recipe == "custom":
        return "the custom recipe imports fp8_quantizer_factory's code, which Primus does not load"
    if not has_fp8_gemm(target) or not _recipe_runs_on(recipe, target):
        return f"the {recipe} recipe needs {RECIPE_NEEDS[recipe]}"
    if args.first_last_layers_bf16 and recipe == "delayed":
        return "the delayed recipe cannot keep the first/last layers in bf16 (megatron-core's rule)"
    return _te_version_refusal(recipe, target)


def _recipe_runs_on(recipe: str, target: Target) -> bool:
    span = RECIPE_HARDWARE[recipe].get(target.accelerator)
    return span is not None and target.capability is not None and span[0] <= target.capability < span[1]


def _te_version_refusal(recipe: str, target: Target) -> str | None:
    """On this host, Transformer Engine's installed version against what megatron-core asks of the recipe."""
    if target.assumed or recipe not in RECIPE_TE_VERSION:
        return None
    import importlib.metadata

    from packaging.version import Version

    for name in ("transformer_engine", "transformer-engine-torch", "transformer_engine_rocm_torch"):
        try:
            have = importlib.metadata.version(name)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    else:
        return None
    need = RECIPE_TE_VERSION[recipe]
    if Version(have) < Version(need):
        return f"the {recipe} recipe needs Transformer Engine >= {need} in megatron-core 0.16.1; {have} is installed"
    return None


def inert_notes(args, given: set[str]) -> list[tuple[str, Any, str]]:
    """Settings read only with FP8 / context parallelism, given without it: accepted, said to do nothing."""
    notes = []
    for dest in sorted(given):
        if dest in FP8_ARGS and not uses_fp8(args):
            notes.append((dest, getattr(args, dest), "accepted, no effect here: read only with fp8"))
        elif dest in CP_ARGS and not uses_context_parallel(args):
            notes.append((dest, getattr(args, dest),
                          "accepted, no effect here: read only with context_parallel_size > 1"))
    return notes


def transformer_kwargs(args) -> dict[str, Any]:
    """FP8 and context-parallel fields of megatron-core's TransformerConfig, filled as Megatron-LM's
    ``core_transformer_config_from_args`` does (``fp8_param`` from ``fp8_param_gather``; a one-item
    ``cp_comm_type`` list as its string)."""
    kw = {dest: getattr(args, dest) for dest in ("fp8", "fp8_recipe", "fp8_margin", "fp8_interval",
                                                 "fp8_amax_history_len", "fp8_amax_compute_algo", "fp8_wgrad",
                                                 "first_last_layers_bf16", "num_layers_at_start_in_bf16",
                                                 "num_layers_at_end_in_bf16", "context_parallel_size",
                                                 "hierarchical_context_parallel_sizes")}
    kw["fp8_param"] = args.fp8_param_gather
    comm = args.cp_comm_type
    kw["cp_comm_type"] = comm[0] if isinstance(comm, list) and len(comm) == 1 else comm
    return kw
