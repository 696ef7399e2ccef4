"""Megatron-LM arguments -> the backend-neutral (model, layout) pair that planning and MFU read."""
from __future__ import annotations

from typing import Any

from primus.plan.layout import ParallelLayout
from primus.plan.model import ModelSpec


def megatron_default_ffn(args) -> int:
    """Megatron-LM's FFN width when ``ffn_hidden_size`` is unset: 4h, or for SwiGLU 2/3 of it
    rounded down to a multiple of 64."""
    h = args.hidden_size
    return int((4 * h * 2 / 3) / 64) * 64 if args.swiglu else 4 * h


def describe(args, neutral: dict[str, Any] | None, world_size: int | None, *,
             vocab_size: int | None = None) -> tuple[ModelSpec | None, ParallelLayout]:
    """The network (the neutral ``model:`` block when present, overridden by the explicit Megatron
    shape arguments) and the layout (data parallel = world / (tp x pp); 1 when the world is unknown).
    ``vocab_size`` (the trainer's padded vocabulary) wins; without it the model is None when the
    vocabulary is not known before the tokenizer loads."""
    neutral = dict(neutral or {})
    vocab = vocab_size or args.vocab_size or neutral.get("vocab_size")
    model = None
    if vocab:
        model = ModelSpec(**{
            **neutral,
            "n_layers": args.num_layers, "dim": args.hidden_size, "n_heads": args.num_attention_heads,
            "n_kv_heads": args.num_query_groups if args.group_query_attention else None,
            "ffn_hidden_size": args.ffn_hidden_size or megatron_default_ffn(args), "vocab_size": vocab,
            "max_seq_len": args.max_position_embeddings or args.seq_length,
            "tie_embeddings": not args.untie_embeddings_and_output_weights,
        })
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    dp = max(1, (world_size or tp * pp) // (tp * pp))
    return model, ParallelLayout(
        tp=tp, pp=pp, dp=dp, micro_batch_size=args.micro_batch_size, global_batch_size=args.global_batch_size,
        seq_len=args.seq_length, recompute=args.recompute_granularity == "full",
        sharding="optimizer" if args.use_distributed_optimizer else "none",
        param_dtype="bf16" if (args.bf16 or args.fp16) else "fp32",
    )
