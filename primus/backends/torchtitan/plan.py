"""TorchTitan settings -> the backend-neutral (model, layout) pair ``primus plan`` estimates.

A neutral ``model:`` block is already a ``ModelSpec``. A registry model (``model: {name, flavor}``)
is read from the config tree TorchTitan itself builds (``model_spec_from_titan``), so the plan
describes the very network the engine trains: dense or MoE layers, GQA or MLA attention, shared
experts, MTP layers. ``parallel_layout`` reads the parallelism settings.
"""
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


def _attention_fields(attention: Any) -> dict[str, Any]:
    if hasattr(attention, "kv_lora_rank"):  # multi-latent attention (DeepSeek)
        return {
            "n_heads": attention.n_heads,
            "q_lora_rank": attention.q_lora_rank or None,  # 0: queries projected directly
            "kv_lora_rank": attention.kv_lora_rank,
            "qk_nope_head_dim": attention.qk_nope_head_dim,
            "qk_rope_head_dim": attention.qk_rope_head_dim,
            "v_head_dim": attention.v_head_dim,
            "head_dim": attention.qk_nope_head_dim + attention.qk_rope_head_dim,
            "qk_norm": True,  # TorchTitan's MLA always normalises its latents (kv_norm; q_norm with q LoRA)
        }
    qkv = attention.qkv_linear
    projection = getattr(qkv, "wqkv", None) or getattr(qkv, "wq", None)
    return {
        "n_heads": qkv.n_heads,
        "n_kv_heads": qkv.n_kv_heads,
        "head_dim": qkv.head_dim,
        "qkv_bias": bool(projection is not None and projection.bias),
        "linear_bias": bool(attention.wo.bias),  # gpt-oss: every linear has a bias (its experts' too)
        "qk_norm": getattr(attention, "qk_norm", None) is not None,
    }


def _rope_fields(rope: Any) -> dict[str, Any]:
    if rope is None:
        return {}
    return {"rope_theta": float(rope.theta), "max_seq_len": rope.max_seq_len,
            "rope_scaling": "llama" if rope.scaling == "llama" else None}


def model_spec_from_titan(config: Any, family: str) -> ModelSpec:
    """The neutral description of a TorchTitan decoder config (``ModelSpec.model``)."""
    layers = list(config.layers)
    first = layers[0]
    moe_layers = [layer.moe for layer in layers if getattr(layer, "moe", None) is not None]
    dense_layers = [layer.feed_forward for layer in layers if getattr(layer, "feed_forward", None) is not None]
    fields: dict[str, Any] = {
        "family": family,
        "n_layers": len(layers),
        "dim": config.dim,
        "vocab_size": config.vocab_size,
        "norm_eps": first.attention_norm.eps,
        "tie_embeddings": bool(getattr(config, "enable_weight_tying", False)),
        "mtp_layers": len(getattr(config, "mtp_layers", None) or []),
        **_attention_fields(first.attention),
        **_rope_fields(getattr(first.attention, "rope", None)),
    }
    if dense_layers:
        fields["ffn_hidden_size"] = dense_layers[0].w1.out_features
    if moe_layers:
        moe = moe_layers[0]
        shared = moe.shared_experts
        fields.update({
            "n_experts": moe.num_experts,
            "top_k": moe.router.top_k,
            "moe_ffn_hidden_size": moe.routed_experts.inner_experts.hidden_dim,
            "shared_expert_ffn_hidden_size": shared.w1.out_features if shared is not None else 0,
            "moe_layer_freq": [int(getattr(layer, "moe", None) is not None) for layer in layers],
        })
    return ModelSpec(**fields)


def parallel_layout(params: dict[str, Any], world_size: int | None = None, n_layers: int | None = None,
                    device: str = "cpu"):
    """The ``ParallelLayout``. ``data_parallel_shard_degree: -1`` fills the world (``world_size``
    when the launcher knows it, else ``WORLD_SIZE`` or ``GPUS_PER_NODE x NNODES``, else 1), as
    TorchTitan does at start-up. Memory as TorchTitan lays it out: FSDP2 on every parameter (a shard
    group of one included), parameters and gradients kept in fp32 and computed in
    ``mixed_precision_param``, sequence parallelism with tensor parallelism, a chunked loss."""
    from primus.plan.layout import ParallelLayout

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
    local = training.get("local_batch_size", 8)
    micro = parallel.get("pipeline_parallel_microbatch_size", 1) if pp > 1 else local
    compute = "bf16" if training.get("mixed_precision_param", "bfloat16") == "bfloat16" else "fp32"
    return ParallelLayout(
        tp=tp, pp=pp, cp=cp, dp=replicate * shard, ep=parallel.get("expert_parallel_degree", 1),
        micro_batch_size=micro,
        global_batch_size=(global_batch if global_batch and global_batch > 0 else local * replicate * shard),
        seq_len=training.get("seq_len", 2048),
        recompute=mode == "full", selective_recompute=mode == "selective",
        sharding="fsdp", dp_shard=shard, param_dtype="fp32", activation_dtype=compute, master_weights=False,
        grad_dtype="bf16" if training.get("mixed_precision_reduce", "float32") == "bfloat16" else "fp32",
        pipeline_layout=_stage_layout(parallel, pp, n_layers) if pp > 1 and n_layers else None,
        sequence_parallel=tp > 1, memory_model="torchtitan", gpu=device.startswith("cuda"),
        loss_chunks=((params.get("loss") or {}).get("num_chunks") or 8),
    )


def _stage_layout(parallel: dict[str, Any], pp: int, n_layers: int) -> str:
    """TorchTitan's split of layers over pipeline stages (``_generate_llm_fqn_per_model_part``: the
    embedding and the output head count as ``first/last_stage_less_layers`` layers each, the rest evenly,
    earlier stages one more), in Megatron's layout notation. One stage per rank (single-stage schedules)."""
    first = parallel.get("pipeline_parallel_first_stage_less_layers", 1)
    last = parallel.get("pipeline_parallel_last_stage_less_layers", 1)
    effective = n_layers + first + last
    per, extra = divmod(effective, pp)
    stages, layer = [], 0
    for stage in range(pp):
        share = per + (1 if stage < extra else 0) - (first if stage == 0 else last if stage == pp - 1 else 0)
        count = max(0, min(share, n_layers - layer))
        layer += count
        stages.append(("E" if stage == 0 else "") + "t" * count + ("L" if stage == pp - 1 else ""))
    return "|".join(stages)
