"""Megatron-LM arguments -> the backend-neutral (model, layout) pair ``primus plan`` estimates."""
from __future__ import annotations

import os
from typing import Any

from primus.plan.model import ModelSpec


def plan_inputs(params: dict[str, Any], world_size: int | None = None):
    """The neutral ``model:`` block when present, overridden by explicit Megatron shape args."""
    from primus.backends.megatron.adapter import megatron_params
    from primus.backends.megatron.arguments import parse_args
    from primus.plan.layout import ParallelLayout

    args = parse_args(megatron_params(params))
    neutral = dict(params.get("model") or {})
    model = ModelSpec(**{
        **neutral,
        "n_layers": args.num_layers, "dim": args.hidden_size, "n_heads": args.num_attention_heads,
        "n_kv_heads": args.num_query_groups if args.group_query_attention else None,
        "ffn_hidden_size": args.ffn_hidden_size, "vocab_size": args.vocab_size or neutral.get("vocab_size"),
        "max_seq_len": args.max_position_embeddings or args.seq_length,
        "tie_embeddings": not args.untie_embeddings_and_output_weights,
    })
    world = world_size or int(os.environ.get("WORLD_SIZE") or
                              int(os.environ.get("GPUS_PER_NODE", "1")) * int(os.environ.get("NNODES", "1")))
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    dp = max(1, world // (tp * pp))
    return model, ParallelLayout(
        tp=tp, pp=pp, dp=dp, micro_batch_size=args.micro_batch_size, global_batch_size=args.global_batch_size,
        seq_len=args.seq_length, recompute=args.recompute_granularity == "full",
        sharding="optimizer" if args.use_distributed_optimizer else "none",
        param_dtype="bf16" if (args.bf16 or args.fp16) else "fp32",
    )
