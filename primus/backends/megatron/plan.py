"""Megatron-LM arguments -> the backend-neutral (ModelSpec, ParallelLayout) pair ``primus plan`` estimates.

``model_from_args`` / ``layout_from_args`` read any object with Megatron-LM's argument names (its
argparse ``dest``s: an ``argparse.Namespace``, our parsed arguments, or a plain mapping such as a
merged preset), fill what is missing with Megatron-LM's defaults, and derive what Megatron-LM's
``validate_args`` derives (``kv_channels``, ``ffn_hidden_size``, ``moe_ffn_hidden_size``, the padded
vocabulary, the ``moe_layer_freq`` pattern), so the plan describes the network Megatron builds.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from primus.config.errors import ConfigError
from primus.plan.layout import ParallelLayout
from primus.plan.model import ModelSpec

# Megatron-LM's defaults (megatron/training/arguments.py at d3528a2) for every argument read here.
MEGATRON_LM_DEFAULTS: dict[str, Any] = {
    "num_layers": None, "hidden_size": None, "ffn_hidden_size": None, "num_attention_heads": None,
    "group_query_attention": False, "num_query_groups": 1, "kv_channels": None,
    "add_qkv_bias": False, "add_bias_linear": True, "qk_layernorm": False,
    "swiglu": False, "normalization": "LayerNorm", "layernorm_epsilon": 1e-5,
    "untie_embeddings_and_output_weights": False, "vocab_size": None, "padded_vocab_size": None,
    "make_vocab_size_divisible_by": 128, "max_position_embeddings": None, "seq_length": None,
    "rotary_base": 10000, "use_rope_scaling": False, "position_embedding_type": "learned_absolute",
    "num_experts": None, "moe_router_topk": 2, "moe_ffn_hidden_size": None,
    "moe_shared_expert_intermediate_size": None, "moe_layer_freq": 1,
    "multi_latent_attention": False, "q_lora_rank": None, "kv_lora_rank": 32, "qk_head_dim": 128,
    "qk_pos_emb_head_dim": 64, "v_head_dim": 128, "mtp_num_layers": None,
    "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "context_parallel_size": 1,
    "expert_model_parallel_size": 1, "expert_tensor_parallel_size": None,
    "micro_batch_size": None, "global_batch_size": None, "recompute_granularity": None,
    "recompute_method": None, "recompute_num_layers": None, "pipeline_model_parallel_layout": None,
    "use_distributed_optimizer": False, "use_torch_fsdp2": False, "use_megatron_fsdp": False,
    "bf16": False, "fp16": False,
    "num_layers_per_virtual_pipeline_stage": None, "num_virtual_stages_per_pipeline_rank": None,
    "sequence_parallel": False, "accumulate_allreduce_grads_in_fp32": False, "overlap_grad_reduce": False,
    "ddp_bucket_size": None, "transformer_impl": "transformer_engine",
}
# Names our argument schema used before it followed Megatron-LM's dests (read as fallbacks).
_OLD_NAMES = {"layernorm_epsilon": "norm_epsilon"}
_OLD_INVERTED = {"add_bias_linear": "disable_bias_linear"}

_PATTERN = re.compile(r"[^,\d\[\]\(\)\+\*]")


def moe_layer_pattern(freq: Any, num_layers: int) -> int | list[int]:
    """Megatron-LM's ``moe_freq_type``: an int, the int as a string, or a list expression such as
    ``"([0]*3+[1]*58)"`` (only digits, commas, brackets, parentheses, + and *, as upstream checks)."""
    if isinstance(freq, bool):
        raise ConfigError(f"moe_layer_freq: expected an integer or a 0/1 pattern, got {freq!r}")
    if isinstance(freq, (int, list)):
        return freq
    text = str(freq).strip()
    if "[" not in text:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"moe_layer_freq: expected an integer or a pattern like ([0]*1+[1]*{num_layers - 1}), "
                              f"got {freq!r}") from None
    if _PATTERN.search(text):
        raise ConfigError(f"moe_layer_freq: invalid pattern {freq!r} (digits, commas, [ ] ( ) + * only)")
    try:
        pattern = eval(text, {"__builtins__": {}}, {})  # safe: the character set above admits no names
    except Exception:  # noqa: BLE001 - any malformed expression is the user's error
        raise ConfigError(f"moe_layer_freq: invalid pattern {freq!r}") from None
    if not isinstance(pattern, list):
        raise ConfigError(f"moe_layer_freq: pattern {freq!r} is not a list")
    return pattern


def resolved_args(args: Any) -> SimpleNamespace:
    """The arguments read here with Megatron-LM's defaults and ``validate_args``' derived values."""
    source = args if isinstance(args, Mapping) else vars(args) if hasattr(args, "__dict__") else {}
    values = {}
    for key, default in MEGATRON_LM_DEFAULTS.items():
        if key in source:
            values[key] = source[key]
        elif key in _OLD_NAMES and _OLD_NAMES[key] in source:
            values[key] = source[_OLD_NAMES[key]]
        elif key in _OLD_INVERTED and _OLD_INVERTED[key] in source:
            values[key] = not source[_OLD_INVERTED[key]]
        else:
            values[key] = getattr(args, key, default) if not isinstance(args, Mapping) else default
    a = SimpleNamespace(**values)
    for key in ("num_layers", "hidden_size", "num_attention_heads"):
        if getattr(a, key) is None:
            raise ConfigError(f"{key} is required to plan (set it, or give a model preset)")
    if a.kv_channels is None:
        a.kv_channels = a.hidden_size // a.num_attention_heads
    if a.ffn_hidden_size is None:
        a.ffn_hidden_size = int((4 * a.hidden_size * 2 / 3) / 64) * 64 if a.swiglu else 4 * a.hidden_size
    if a.num_experts == 0:
        a.num_experts = None
    if a.num_experts is not None and a.moe_ffn_hidden_size is None:
        a.moe_ffn_hidden_size = a.ffn_hidden_size
    if not a.group_query_attention:
        a.num_query_groups = a.num_attention_heads
    a.moe_layer_freq = moe_layer_pattern(a.moe_layer_freq, a.num_layers)
    if a.padded_vocab_size is None:
        if a.vocab_size is None:
            raise ConfigError("vocab_size is required to plan (the tokenizer is not loaded; the model presets set it)")
        multiple = a.make_vocab_size_divisible_by * a.tensor_model_parallel_size
        a.padded_vocab_size = -(-a.vocab_size // multiple) * multiple
    return a


def model_from_args(args: Any) -> ModelSpec:
    """The ``ModelSpec`` of the network Megatron-LM builds from ``args`` (Megatron-LM dests)."""
    a = resolved_args(args)
    mla = bool(a.multi_latent_attention)
    moe = a.num_experts is not None
    spec: dict[str, Any] = dict(
        family="megatron",
        n_layers=a.num_layers, dim=a.hidden_size, n_heads=a.num_attention_heads,
        n_kv_heads=None if mla or a.num_query_groups == a.num_attention_heads else a.num_query_groups,
        head_dim=a.kv_channels, ffn_hidden_size=a.ffn_hidden_size, vocab_size=a.padded_vocab_size,
        rope_theta=float(a.rotary_base), rope_scaling="llama" if a.use_rope_scaling else None,
        norm_eps=a.layernorm_epsilon, max_seq_len=a.max_position_embeddings or a.seq_length or 131072,
        tie_embeddings=not a.untie_embeddings_and_output_weights,
        learned_position_embeddings=a.position_embedding_type == "learned_absolute",
        qkv_bias=bool(a.add_qkv_bias), linear_bias=bool(a.add_bias_linear), qk_norm=bool(a.qk_layernorm),
        swiglu=bool(a.swiglu), normalization="rmsnorm" if a.normalization == "RMSNorm" else "layernorm",
        mtp_layers=a.mtp_num_layers or 0,
    )
    if mla:
        spec.update(q_lora_rank=a.q_lora_rank, kv_lora_rank=a.kv_lora_rank, qk_nope_head_dim=a.qk_head_dim,
                    qk_rope_head_dim=a.qk_pos_emb_head_dim, v_head_dim=a.v_head_dim)
    if moe:
        spec.update(n_experts=a.num_experts, top_k=a.moe_router_topk, moe_ffn_hidden_size=a.moe_ffn_hidden_size,
                    shared_expert_ffn_hidden_size=a.moe_shared_expert_intermediate_size or 0,
                    moe_layer_freq=a.moe_layer_freq)
    try:
        return ModelSpec(**spec)
    except ValueError as exc:  # pydantic's ValidationError: one line naming the first problem
        errors = getattr(exc, "errors", None)
        message = errors()[0]["msg"] if errors else str(exc)
        raise ConfigError(f"the Megatron model arguments do not describe a valid network: {message}") from None


def layout_from_args(args: Any, world_size: int | None = None, device: str = "cpu") -> ParallelLayout:
    """The ``ParallelLayout`` of ``args`` on ``world_size`` ranks (default: the launcher's environment), with
    megatron-core's memory layout: its local layer spec on CPU, Transformer Engine's on a GPU."""
    a = resolved_args(args)
    world = world_size or _environment_world_size()
    tp, pp, cp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size
    dp = max(1, world // (tp * pp * cp))
    sharding = "fsdp" if (a.use_torch_fsdp2 or a.use_megatron_fsdp) else \
        "optimizer" if a.use_distributed_optimizer else "none"
    param_dtype = "bf16" if a.bf16 else "fp16" if a.fp16 else "fp32"
    te = device.startswith("cuda") and a.transformer_impl == "transformer_engine"
    return ParallelLayout(
        tp=tp, pp=pp, cp=cp, dp=dp,
        ep=a.expert_model_parallel_size, etp=a.expert_tensor_parallel_size,
        micro_batch_size=a.micro_batch_size or 1, global_batch_size=a.global_batch_size,
        seq_len=a.seq_length or 2048, sharding=sharding, param_dtype=param_dtype,
        grad_dtype="fp32" if a.accumulate_allreduce_grads_in_fp32 else param_dtype,
        pipeline_layout=a.pipeline_model_parallel_layout, vpp=_virtual_stages(a),
        sequence_parallel=bool(a.sequence_parallel) and tp > 1,
        **_recompute(a),
        memory_model="megatron-te" if te else "megatron", gpu=device.startswith("cuda"),
        # megatron-core DDP: buckets only when gradient reduction overlaps the backward pass
        grad_bucket_size=(a.ddp_bucket_size or max(40_000_000, 1_000_000 * dp * cp)) if a.overlap_grad_reduce else None,
    )


def _virtual_stages(a) -> int:
    """Megatron-LM's virtual_pipeline_model_parallel_size (1: no interleaving)."""
    pp = a.pipeline_model_parallel_size
    if a.pipeline_model_parallel_layout is not None:
        from primus.plan.layout import parse_pipeline_layout

        return max(1, len(parse_pipeline_layout(a.pipeline_model_parallel_layout)) // pp)
    if a.num_virtual_stages_per_pipeline_rank is not None:
        return max(1, a.num_virtual_stages_per_pipeline_rank)
    if a.num_layers_per_virtual_pipeline_stage is not None:
        return max(1, a.num_layers // pp // a.num_layers_per_virtual_pipeline_stage)
    return 1


def _recompute(a) -> dict[str, Any]:
    """Megatron-LM's recomputation: full (uniform: every layer, in groups of recompute_num_layers; block: the
    first recompute_num_layers of each model chunk) or selective (the core attention)."""
    if a.recompute_granularity == "selective":
        return {"selective_recompute": True}
    if a.recompute_granularity != "full" or (a.recompute_method == "block" and a.recompute_num_layers == 0):
        return {}
    if a.recompute_method == "block":
        return {"recompute": True, "recompute_layers": a.recompute_num_layers}
    return {"recompute": True, "recompute_group": a.recompute_num_layers or 1}


def plan_from_args(args: Any, world_size: int | None = None) -> tuple[ModelSpec, ParallelLayout]:
    return model_from_args(args), layout_from_args(args, world_size)


def flops_per_step(args: Any, global_batch_size: int, padded_vocab_size: int | None = None) -> float:
    """Model FLOPs of one training step, in the one convention every backend reports MFU with
    (``primus.plan.flops``: Megatron-LM d3528a2's ``num_floating_point_operations``). The trainer
    passes the vocabulary it built (padded from the tokenizer when ``vocab_size`` is unset)."""
    from primus.plan.flops import flops_per_token

    source = dict(args) if isinstance(args, Mapping) else dict(vars(args))
    if padded_vocab_size is not None:
        source["padded_vocab_size"] = padded_vocab_size
    seq_length = source.get("seq_length")
    if not seq_length:
        raise ConfigError("seq_length is required to count FLOPs per step")
    return flops_per_token(model_from_args(source), seq_length) * global_batch_size * seq_length


def _environment_world_size() -> int:
    if os.environ.get("WORLD_SIZE"):
        return int(os.environ["WORLD_SIZE"])
    return int(os.environ.get("GPUS_PER_NODE", "1")) * int(os.environ.get("NNODES", "1"))


def plan_inputs(params: dict[str, Any], world_size: int | None = None):
    """(ModelSpec, ParallelLayout) of a module's params, validated by the Megatron argument schema first.

    A neutral ``model:`` block is translated by ``parse_args``; its informational keys
    (``family``, ``embedding_init_std``) are kept."""
    from primus.backends.megatron.adapter import megatron_params
    from primus.backends.megatron.arguments import parse_args

    args = parse_args(megatron_params(params))
    model, layout = plan_from_args(args, world_size)
    neutral = params.get("model") or {}
    kept = {k: neutral[k] for k in ("family", "embedding_init_std") if neutral.get(k) is not None}
    return (model.model_copy(update=kept) if kept else model), layout


def describe(args: Any, neutral: Mapping[str, Any] | None, world_size: int | None,
             device: str = "cpu", vocab_size: int | None = None) -> tuple[ModelSpec | None, ParallelLayout]:
    """What ``EnginePlan`` holds for parsed Megatron arguments: the network and the layout on
    ``world_size`` ranks (one data-parallel replica when the world is not known yet), for ``device``'s kernels.

    ``vocab_size`` is the vocabulary a plan knows without loading the tokenizer (``tokenizers.plan_vocab``);
    None: unknown, and the network is described with a vocabulary of 0 (embedding and output layer not
    counted; ModelSpec itself never accepts 0 from a preset: a plan-only value)."""
    source = dict(args) if isinstance(args, Mapping) else dict(vars(args))
    unknown = not (source.get("vocab_size") or source.get("padded_vocab_size") or vocab_size)
    if not source.get("vocab_size"):
        source["vocab_size"] = vocab_size or 1  # 1: a placeholder while unknown, replaced by 0 below
    model = model_from_args(source)
    if unknown:
        model = model.model_copy(update={"vocab_size": 0})
    kept = {k: (neutral or {})[k] for k in ("family", "embedding_init_std") if (neutral or {}).get(k) is not None}
    if model is not None and kept:
        model = model.model_copy(update=kept)
    parallel = (source.get("tensor_model_parallel_size") or 1) * (source.get("pipeline_model_parallel_size") or 1) \
        * (source.get("context_parallel_size") or 1)
    return model, layout_from_args(source, world_size or parallel, device)
