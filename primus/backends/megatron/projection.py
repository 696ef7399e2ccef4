"""Megatron-LM arguments -> what the step-time projection needs beyond the layout, and a layout as
Megatron-LM arguments (the overrides ``primus plan --search`` prints)."""
from __future__ import annotations

from typing import Any

from primus.plan.projection import ProjectionOptions


def projection_options(args: Any, *, gpu: bool = True) -> ProjectionOptions:
    """Interleaving, fp8, recompute, sequence parallelism and overlaps as Megatron-LM sets them.
    ``gpu=False`` (a CPU run): megatron-core's fused kernels (TE, Apex) are absent, ops run eagerly."""
    from primus.backends.megatron.validate_args import virtual_pipeline_size

    granularity = getattr(args, "recompute_granularity", None)
    if granularity == "full" and getattr(args, "recompute_method", None) == "block" \
            and getattr(args, "recompute_num_layers", None) == 0:
        granularity = None  # AMD Primus's way of switching recompute off in a preset
    fp8 = bool(getattr(args, "fp8", None))
    dtype = "fp8" if fp8 else "bf16" if getattr(args, "bf16", False) or getattr(args, "fp16", False) else "fp32"
    tp = getattr(args, "tensor_model_parallel_size", 1) or 1
    return ProjectionOptions(
        vpp=virtual_pipeline_size(args) or 1, gemm_dtype=dtype, recompute=granularity or "none",
        sequence_parallel=bool(getattr(args, "sequence_parallel", False)) and tp > 1,
        fused_elementwise=gpu, overlap_grad_reduce=bool(getattr(args, "overlap_grad_reduce", False)),
        overlap_param_gather=bool(getattr(args, "overlap_param_gather", False)),
        tp_comm_overlap=bool(getattr(args, "tp_comm_overlap", False)),
        # moe_grouped_gemm runs TE's / grouped_gemm's kernels on a GPU; on a CPU megatron-core falls back to
        # SequentialMLP, a loop of plain GEMMs over the local experts
        grouped_experts=gpu and bool(getattr(args, "moe_grouped_gemm", False)),
        # the alltoall dispatcher: counts all-gathered, then tokens and their routing weights each all-to-all'd
        ep_probs_alltoall=getattr(args, "moe_token_dispatcher_type", "allgather") == "alltoall",
        ep_count_exchange="allgather" if getattr(args, "moe_token_dispatcher_type", "allgather") == "alltoall" else None,
        # the loss over the data-parallel ranks (Primus's trainer), and an MoE's auxiliary-loss tracker's
        step_allreduces=1 + (1 if getattr(args, "num_experts", None) else 0))


def layout_overrides(choice: dict[str, Any]) -> list[str]:
    """A searched layout (``primus.plan.search.Choice.to_dict()``) as Megatron-LM argument overrides."""
    out = [f"tensor_model_parallel_size={choice['tp']}", f"pipeline_model_parallel_size={choice['pp']}",
           f"context_parallel_size={choice['cp']}", f"expert_model_parallel_size={choice['ep']}",
           f"micro_batch_size={choice['micro_batch_size']}"]
    if choice.get("etp"):
        out.append(f"expert_tensor_parallel_size={choice['etp']}")
    out.append(f"num_virtual_stages_per_pipeline_rank={choice['vpp']}" if choice["vpp"] > 1
               else "num_virtual_stages_per_pipeline_rank=null")
    out.append(f"sequence_parallel={str(choice['tp'] > 1).lower()}")
    recompute = choice["recompute"]
    out.append(f"recompute_granularity={'null' if recompute == 'none' else recompute}")
    if recompute == "full":
        out += ["recompute_method=uniform", "recompute_num_layers=1"]
    else:
        out += ["recompute_method=null", "recompute_num_layers=null"]
    sharding = choice["sharding"]
    out.append(f"use_distributed_optimizer={str(sharding == 'optimizer').lower()}")
    out.append(f"use_torch_fsdp2={str(sharding == 'fsdp').lower()}")
    if sharding != "optimizer":  # Megatron-LM gathers parameters itself only with the distributed optimizer
        out.append("overlap_param_gather=false")
    if sharding == "fsdp":  # Megatron-LM: torch FSDP2 does not take gradient-accumulation fusion
        out.append("gradient_accumulation_fusion=false")
    return out


def _runs_here(key: str) -> bool:
    """Whether Primus's Megatron backend runs ``key`` (``support.REFUSED``: accepted by validate and plan,
    refused when the run starts): the search proposes only layouts ``primus train`` runs."""
    from primus.backends.megatron.support import REFUSED

    return key not in REFUSED


RECOMPUTES = ("none", "selective", "full")  # recompute_granularity null, selective (core attention), full
STEPS_KEY = "train_iters"  # how many steps a run trains (primus plan --search --measure)
# DDP, distributed optimizer, torch FSDP2 (when the backend runs it)
SHARDINGS = ("none", "optimizer") + (("fsdp",) if _runs_here("use_torch_fsdp2") else ())
CONTEXT_PARALLEL = _runs_here("context_parallel_size")
