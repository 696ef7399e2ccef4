"""Megatron-LM arguments -> megatron-core objects: TransformerConfig, GPTModel chunks wrapped in
Megatron DDP, the Megatron optimizer and its LR scheduler. Nothing here re-implements Megatron.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any

from primus.backends.megatron.arguments import MegatronArgs


@dataclass
class Derived:
    """Settings the backend chose for the user; each is logged once with its reason."""

    values: dict[str, Any] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)

    def set(self, key: str, value: Any, reason: str) -> Any:
        self.values[key], self.reasons[key] = value, reason
        return value

    def log(self, ctx) -> None:
        for key, value in self.values.items():
            ctx.log_derived(key, value, self.reasons[key])


def padded_vocab_size(vocab_size: int, args: MegatronArgs) -> int:
    """Megatron-LM's ``_vocab_size_with_padding``: a multiple of divisible_by x TP."""
    multiple = args.make_vocab_size_divisible_by * args.tensor_model_parallel_size
    return ((vocab_size + multiple - 1) // multiple) * multiple


def use_transformer_engine(args: MegatronArgs, on_gpu: bool) -> bool:
    if args.transformer_impl == "local":
        return False
    available = on_gpu and importlib.util.find_spec("transformer_engine") is not None
    if args.transformer_impl == "transformer_engine" and not available:
        from primus.config.errors import ConfigError

        raise ConfigError("transformer_impl: transformer_engine needs a GPU and Transformer Engine installed; "
                          "use transformer_impl: local")
    return available


def params_dtype(args: MegatronArgs):
    import torch

    return torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else torch.float32


# TransformerConfig fusion flag -> the module its GPU kernel comes from (None: megatron-core's own jit)
_FUSION_KERNELS = {
    "bias_activation_fusion": None, "bias_dropout_fusion": None,
    "masked_softmax_fusion": "scaled_masked_softmax_cuda",  # Megatron-LM's compiled extension
    "persist_layer_norm": "apex",  # Apex's FusedLayerNorm
    "apply_rope_fusion": "transformer_engine",  # >= 1.4, as megatron-core's rope_utils finds it
    "gradient_accumulation_fusion": "fused_weight_gradient_mlp_cuda",
}


def _kernel_installed(module: str | None) -> bool:
    if module is None:
        return True
    if module == "transformer_engine":
        from megatron.core.models.common.embeddings import rope_utils

        return getattr(rope_utils, "fused_apply_rotary_pos_emb", None) is not None
    return importlib.util.find_spec(module) is not None


def fusion_flags(on_gpu: bool, derived: Derived) -> dict[str, bool]:
    """The fusion flags, on as Megatron-LM sets them on a GPU, but each only where its kernel is
    installed: megatron-core refuses (RoPE) or crashes at the first step (softmax, norm) otherwise."""
    if not on_gpu:
        derived.set("fused_kernels", False, "CPU: bias/activation, softmax, layer-norm, RoPE fusions and "
                    "gradient_accumulation_fusion are CUDA kernels")
        return dict.fromkeys(_FUSION_KERNELS, False)
    flags = {name: _kernel_installed(module) for name, module in _FUSION_KERNELS.items()}
    off = [name for name, on in flags.items() if not on]
    if off:
        derived.set("fusions_off", ",".join(off), "their kernels (Transformer Engine, Apex, Megatron-LM's "
                    "compiled extensions) are not installed")
    return flags


def transformer_config(args: MegatronArgs, *, on_gpu: bool, derived: Derived):
    """The TransformerConfig for ``args`` (names mapped as Megatron-LM's ``core_transformer_config_from_args``)."""
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    ffn = args.ffn_hidden_size
    if ffn is None:
        # Megatron-LM's default: 4h, or for SwiGLU 2/3 of that rounded down to a multiple of 64.
        ffn = int((4 * args.hidden_size * 2 / 3) / 64) * 64 if args.swiglu else 4 * args.hidden_size
        derived.set("ffn_hidden_size", ffn, "not set: Megatron-LM default from hidden_size")
    fusions = fusion_flags(on_gpu, derived)
    if args.embedding_init_method_std is None and args.model is not None:
        derived.set("embedding_init_method_std", args.init_method_std,
                    "not set: megatron-core uses init_method_std; TorchTitan draws the same preset's embedding "
                    "with std 1.0 (set model.embedding_init_std for the same init on both)")
    dtype = params_dtype(args)
    return TransformerConfig(
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        ffn_hidden_size=ffn,
        num_attention_heads=args.num_attention_heads,
        num_query_groups=args.num_query_groups if args.group_query_attention else None,
        kv_channels=args.kv_channels,
        hidden_dropout=args.hidden_dropout,
        attention_dropout=args.attention_dropout,
        layernorm_epsilon=args.norm_epsilon,
        normalization=args.normalization,
        gated_linear_unit=args.swiglu,
        activation_func=F.silu if args.swiglu else F.gelu,
        add_bias_linear=not args.disable_bias_linear,
        init_method_std=args.init_method_std,
        embedding_init_method_std=args.embedding_init_method_std,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size,
        sequence_parallel=args.sequence_parallel,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=args.bf16,
        fp16=args.fp16,
        recompute_granularity=args.recompute_granularity,
        recompute_method=args.recompute_method,
        recompute_num_layers=args.recompute_num_layers,
        use_cpu_initialization=not on_gpu,
        **fusions,
        deallocate_pipeline_outputs=True,
    )


def build_model(args: MegatronArgs, config, vocab_size: int, *, use_te: bool) -> list:
    """GPTModel chunks for this rank (one, or one per virtual pipeline stage)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )

    if use_te:
        spec = get_gpt_layer_with_transformer_engine_spec(normalization=args.normalization)
    else:
        spec = get_gpt_layer_local_spec(normalization=args.normalization)
    vpp = args.virtual_pipeline_model_parallel_size
    chunks = []
    for vp_stage in range(vpp or 1):
        stage = vp_stage if vpp else None
        model = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=vocab_size,
            max_sequence_length=args.max_position_embeddings or args.seq_length,
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage),
            share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
            position_embedding_type=args.position_embedding_type,
            rotary_percent=args.rotary_percent,
            rotary_base=int(args.rotary_base),
            rope_scaling=args.use_rope_scaling,
            rope_scaling_factor=args.rope_scaling_factor,
            vp_stage=stage,
        )
        chunks.append(model)
    return chunks


def wrap_float16(args: MegatronArgs, config, chunks: list) -> list:
    """Megatron-LM's ``get_model`` step for bf16/fp16: ``Float16Module`` casts every parameter
    (norms included) to the training dtype and the last stage's output back to fp32. Without it
    the norms stay fp32, and the fp16 optimizer's checkpoint cannot map their state to the model
    ("Param id N does not match any model sharded param")."""
    if not (args.bf16 or args.fp16):
        return chunks
    from megatron.core.transformer.module import Float16Module

    return [Float16Module(config, chunk) for chunk in chunks]


def wrap_ddp(args: MegatronArgs, config, chunks: list) -> list:
    """Megatron DistributedDataParallel around each chunk (bucketing only on the first, as Megatron-LM)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=args.accumulate_allreduce_grads_in_fp32,
        overlap_grad_reduce=args.overlap_grad_reduce,
        overlap_param_gather=args.overlap_param_gather,
        use_distributed_optimizer=args.use_distributed_optimizer,
    )
    return [
        DistributedDataParallel(config=config, ddp_config=ddp_config, module=chunk, disable_bucketing=i > 0)
        for i, chunk in enumerate(chunks)
    ]


def build_optimizer(args: MegatronArgs, chunks: list):
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    config = OptimizerConfig(
        optimizer=args.optimizer,
        lr=args.lr,
        min_lr=args.min_lr,
        weight_decay=args.weight_decay,
        adam_beta1=args.adam_beta1,
        adam_beta2=args.adam_beta2,
        adam_eps=args.adam_eps,
        sgd_momentum=args.sgd_momentum,
        clip_grad=args.clip_grad,
        bf16=args.bf16,
        fp16=args.fp16,
        params_dtype=params_dtype(args),
        loss_scale=args.loss_scale,
        initial_loss_scale=args.initial_loss_scale,
        use_distributed_optimizer=args.use_distributed_optimizer,
        overlap_param_gather=args.overlap_param_gather,
    )
    return get_megatron_optimizer(config, chunks)


def build_scheduler(args: MegatronArgs, optimizer, global_batch_size: int):
    """Megatron-LM's iteration-based schedule, counted in samples (``get_optimizer_param_scheduler``)."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    decay_iters = args.lr_decay_iters or args.train_iters
    return OptimizerParamScheduler(
        optimizer,
        init_lr=args.lr_warmup_init,
        max_lr=args.lr,
        min_lr=args.min_lr,
        lr_warmup_steps=args.lr_warmup_iters * global_batch_size,
        lr_decay_steps=decay_iters * global_batch_size,
        lr_decay_style=args.lr_decay_style,
        start_wd=args.weight_decay,
        end_wd=args.weight_decay,
        wd_incr_steps=args.train_iters * global_batch_size,
        wd_incr_style="constant",
        wsd_decay_steps=decay_iters * global_batch_size if args.lr_decay_style == "WSD" else None,
        lr_wsd_decay_style="linear" if args.lr_decay_style == "WSD" else None,
    )
