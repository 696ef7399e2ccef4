"""TorchTitan settings -> what the step-time projection needs beyond the layout, and a layout as
TorchTitan overrides (the ones ``primus plan --search`` prints)."""
from __future__ import annotations

from typing import Any

from primus.plan.projection import ProjectionOptions

INTERLEAVED = ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "LoopedBFS")


def projection_options(params: dict[str, Any], *, gpu: bool = True, converters: list[str] = ()) -> ProjectionOptions:
    """From the module's TorchTitan sections: activation checkpointing (TorchTitan's default is
    selective), float8 converters, torch.compile (fused elementwise kernels; eager otherwise), async TP,
    the pipeline schedule and micro-batch. TorchTitan's TP always shards the sequence for norms.
    ``converters``: model converters the experiment names (Primus takes them out of the params and
    keeps them as translations, since a run here refuses float8)."""
    parallel = params.get("parallelism") or {}
    model = params.get("model") or {}
    fp8 = any("float8" in str(c) for c in [*converters, *(model.get("converters") or [])])
    mixed = (params.get("training") or {}).get("mixed_precision_param", "bfloat16")
    mode = (params.get("activation_checkpoint") or {}).get("mode", "selective")
    implementation = str((params.get("optimizer") or {}).get("implementation", "fused"))
    compile_enabled = bool((params.get("compile") or {}).get("enable", False))
    schedule = parallel.get("pipeline_parallel_schedule", "1F1B")
    pp = parallel.get("pipeline_parallel_degree", 1) or 1
    vpp = 1
    if pp > 1 and schedule in INTERLEAVED:
        vpp = max(2, int(parallel.get("pipeline_parallel_stages_per_rank", 2) or 2))
    return ProjectionOptions(
        vpp=vpp, gemm_dtype="fp8" if fp8 else "bf16" if mixed == "bfloat16" else "fp32",
        # TorchTitan 0.3.0's GroupedExperts casts to bf16 whatever the mixed precision (Llama 4's
        # transformers-backend experts compute in the parameters' dtype)
        expert_gemm_dtype=None if model.get("name") == "llama4" else "bf16",
        grouped_experts=model.get("name") != "llama4",  # GroupedExperts: torch._grouped_mm
        fsdp_copies=True,  # FSDP2 wraps the model whatever the data-parallel degree
        loss_parallel=not parallel.get("disable_loss_parallel", False),
        norm_grad_allreduce=True,
        ep_count_exchange="alltoall",  # the token dispatcher all-to-alls the tokens per expert first
        step_allreduces=4,  # the valid tokens, the loss's sum and max, the token count (its logging)
        grad_norm_group="world",  # the DTensor gradient norm over the whole mesh
        # foreach as asked, or fused on a CPU (fused AdamW is CUDA-only there: Primus derives foreach)
        optimizer_foreach=implementation == "foreach" or (not gpu and implementation.startswith("fused")),
        recompute={"selective": "op", "full": "full"}.get(mode, "none"),  # TorchTitan's selective is per-op
        sequence_parallel=True, fused_elementwise=gpu and compile_enabled, attention="sdpa",
        tp_comm_overlap=bool(parallel.get("enable_async_tensor_parallel", False)),
        pp_microbatch_size=parallel.get("pipeline_parallel_microbatch_size", 1) if pp > 1 else None)


def layout_overrides(choice: dict[str, Any]) -> list[str]:
    """A searched layout (``primus.plan.search.Choice.to_dict()``) as TorchTitan overrides."""
    shard = choice["dp"] if choice["sharding"] == "fsdp" else 1
    replicate = 1 if choice["sharding"] == "fsdp" else choice["dp"]
    out = [f"parallelism.tensor_parallel_degree={choice['tp']}",
           f"parallelism.pipeline_parallel_degree={choice['pp']}",
           f"parallelism.context_parallel_degree={choice['cp']}",
           f"parallelism.expert_parallel_degree={choice['ep']}",
           f"parallelism.data_parallel_shard_degree={shard}",
           f"parallelism.data_parallel_replicate_degree={replicate}",
           f"training.local_batch_size={choice['local_batch_size']}",
           f"activation_checkpoint.mode={ {'op': 'selective'}.get(choice['recompute'], choice['recompute'])}"]
    if choice["pp"] > 1:
        out += [f"parallelism.pipeline_parallel_microbatch_size={choice['micro_batch_size']}",
                f"parallelism.pipeline_parallel_schedule={'Interleaved1F1B' if choice['vpp'] > 1 else '1F1B'}"]
    return out


RECOMPUTES = ("none", "op", "full")  # activation_checkpoint.mode none, selective (per-op), full
STEPS_KEY = "training.steps"  # how many steps a run trains (primus plan --search --measure)
SHARDINGS = ("none", "fsdp")  # DDP (data_parallel_replicate_degree) or FSDP2 (data_parallel_shard_degree)
CONTEXT_PARALLEL = True
