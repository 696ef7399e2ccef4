"""TorchTitan settings -> the backend-neutral (model, layout) pair ``primus plan`` estimates."""
from __future__ import annotations

import os
from typing import Any

from primus.plan.model import ModelSpec


def _world_size(given: int | None = None) -> int:
    if given:
        return given
    if os.environ.get("WORLD_SIZE"):
        return int(os.environ["WORLD_SIZE"])
    return int(os.environ.get("GPUS_PER_NODE", "1")) * int(os.environ.get("NNODES", "1"))


def plan_inputs(params: dict[str, Any], world_size: int | None = None):
    """(ModelSpec, ParallelLayout). ``data_parallel_shard_degree: -1`` fills the world
    (``world_size`` when the launcher knows it, else ``WORLD_SIZE`` or ``GPUS_PER_NODE x NNODES``,
    else 1), as TorchTitan does at start-up."""
    from primus.plan.layout import ParallelLayout

    model = ModelSpec(**params["model"])
    training = params.get("training") or {}
    parallel = params.get("parallelism") or {}
    tp = parallel.get("tensor_parallel_degree", 1)
    pp = parallel.get("pipeline_parallel_degree", 1)
    cp = parallel.get("context_parallel_degree", 1)
    replicate = parallel.get("data_parallel_replicate_degree", 1)
    shard = parallel.get("data_parallel_shard_degree", -1)
    if shard < 1:
        shard = max(1, _world_size(world_size) // (tp * pp * cp * replicate))
    mode = (params.get("activation_checkpoint") or {}).get("mode", "selective")
    global_batch = training.get("global_batch_size", -1)
    return model, ParallelLayout(
        tp=tp, pp=pp, cp=cp, dp=replicate * shard,
        micro_batch_size=training.get("local_batch_size", 8),
        global_batch_size=global_batch if global_batch and global_batch > 0 else None,
        seq_len=training.get("seq_len", 2048),
        recompute=mode == "full",
        sharding="fsdp" if shard > 1 else "none",
        param_dtype="bf16" if training.get("mixed_precision_param", "bfloat16") == "bfloat16" else "fp32",
    )
