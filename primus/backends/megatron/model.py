"""Megatron-LM arguments -> megatron-core objects: TransformerConfig, GPTModel chunks wrapped in
Megatron DDP, the Megatron optimizer and its LR scheduler. Nothing here re-implements Megatron.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from primus.backends.megatron import te_features
from primus.backends.megatron.arguments import MegatronArgs

if TYPE_CHECKING:
    from primus.plan.target import Target


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


def use_transformer_engine(args: MegatronArgs, target: "Target", derived: Derived | None = None) -> bool:
    """Megatron-LM's default is Transformer Engine; where it is not importable on a GPU (always on
    CPU) megatron-core's local spec builds the same layers, and a derived line says so. (FP8 and
    context parallelism need it: admission refused them on such a target, ``te_features.py``.)"""
    available = target.gpu and target.transformer_engine
    use = args.transformer_impl == "transformer_engine" and available
    reason = ("Transformer Engine on GPU" if use else f"transformer_impl: {args.transformer_impl}"
              if args.transformer_impl == "local" else
              "no GPU / Transformer Engine here: megatron-core's local layer spec (same math)")
    if use and args.softmax_type != "vanilla" and not _te_at_least("2.8.0"):
        use, reason = False, (f"softmax_type: {args.softmax_type} needs Transformer Engine >= 2.8 (megatron-core); "
                              "megatron-core's local attention computes the same sinks")
    if derived is not None:
        derived.set("transformer_impl", "transformer_engine" if use else "local", reason)
    return use


def _te_at_least(version: str) -> bool:
    from megatron.core.utils import is_te_min_version

    return is_te_min_version(version)


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


def requested_fusions(args: MegatronArgs) -> dict[str, bool]:
    """The fusion flags Megatron-LM's arguments ask for (core_transformer_config_from_args)."""
    return {
        "bias_activation_fusion": args.bias_swiglu_fusion if args.swiglu else args.bias_gelu_fusion,
        "bias_dropout_fusion": args.bias_dropout_fusion,
        "masked_softmax_fusion": args.masked_softmax_fusion,
        "persist_layer_norm": not args.no_persist_layer_norm,
        "apply_rope_fusion": args.apply_rope_fusion,
        "gradient_accumulation_fusion": args.gradient_accumulation_fusion,
    }


def fusion_flags(args: MegatronArgs, on_gpu: bool, derived: Derived) -> dict[str, bool]:
    """The fusions the arguments ask for, each only where its kernel is installed: megatron-core
    refuses (RoPE) or crashes at the first step (softmax, norm) otherwise. Same math either way."""
    requested = requested_fusions(args)
    if not on_gpu:
        if any(requested.values()):
            derived.set("fused_kernels", False, "CPU: bias/activation, softmax, layer-norm, RoPE fusions and "
                        "gradient_accumulation_fusion are CUDA kernels")
        return dict.fromkeys(_FUSION_KERNELS, False)
    flags = {name: want and _kernel_installed(_FUSION_KERNELS[name]) for name, want in requested.items()}
    off = [name for name, on in flags.items() if requested[name] and not on]
    if off:
        derived.set("fusions_off", ",".join(off), "their kernels (Transformer Engine, Apex, Megatron-LM's "
                    "compiled extensions) are not installed")
    return flags


def grouped_gemm_available(use_te: bool) -> bool:
    """megatron-core's grouped experts: TEGroupedMLP (Transformer Engine) or the legacy GroupedMLP
    (the ``grouped_gemm`` package, CUDA only)."""
    if use_te:
        return True
    import torch

    return torch.cuda.is_available() and importlib.util.find_spec("grouped_gemm") is not None


def _activation(args, kw: dict) -> None:
    """Megatron-LM's activation choice (core_transformer_config_from_args)."""
    import torch.nn.functional as F

    if args.swiglu:
        kw.update(activation_func=F.silu, gated_linear_unit=True)
    elif args.squared_relu:
        from megatron.core.activations import squared_relu

        kw["activation_func"] = squared_relu
    elif args.quick_geglu:
        from megatron.core.fusions.fused_bias_geglu import quick_gelu

        kw.update(activation_func=quick_gelu, gated_linear_unit=True)
    else:
        kw["activation_func"] = F.gelu


def transformer_config(args: MegatronArgs, *, on_gpu: bool, derived: Derived, use_te: bool = False):
    """The (MLA)TransformerConfig for ``args``, filled as Megatron-LM's ``core_transformer_config_from_args``:
    every implemented argument that names a config field is passed by name, then the renamed ones."""
    import dataclasses

    import torch
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    from primus.backends.megatron.support import IMPLEMENTED
    from primus.backends.megatron.validate_args import virtual_pipeline_size

    config_class = MLATransformerConfig if args.multi_latent_attention else TransformerConfig
    names = {f.name for f in dataclasses.fields(config_class)}
    kw = {key: getattr(args, key) for key, where in IMPLEMENTED.items() if where == "TransformerConfig" and key in names}
    _activation(args, kw)
    if args.init_method_xavier_uniform:
        kw.update(init_method=torch.nn.init.xavier_uniform_, scaled_init_method=torch.nn.init.xavier_uniform_)
    kw["num_query_groups"] = args.num_query_groups if args.group_query_attention else None
    kw["num_moe_experts"] = args.num_experts
    kw["num_layers_in_first_pipeline_stage"] = args.decoder_first_pipeline_num_layers
    kw["num_layers_in_last_pipeline_stage"] = args.decoder_last_pipeline_num_layers
    kw["virtual_pipeline_model_parallel_size"] = virtual_pipeline_size(args)
    if args.rope_type is None:
        kw.pop("rope_type", None)  # the config class's own default (MLA: yarn)
    if args.num_experts:
        grouped = args.moe_grouped_gemm and grouped_gemm_available(use_te)
        if args.moe_grouped_gemm and not grouped:
            derived.set("moe_grouped_gemm", False, "no Transformer Engine / grouped_gemm kernels here: "
                        "megatron-core's SequentialMLP runs the same experts one by one")
        kw["moe_grouped_gemm"] = grouped
    if args.mtp_num_layers == 0:
        kw["mtp_num_layers"] = None
    dtype = params_dtype(args)
    kw.update(fusion_flags(args, on_gpu, derived))
    kw.update(te_features.transformer_kwargs(args))  # FP8 / context parallel: Transformer Engine layers
    if args.embedding_init_method_std is None and args.model is not None:
        derived.set("embedding_init_method_std", args.init_method_std,
                    "not set: megatron-core uses init_method_std; TorchTitan draws the same preset's embedding "
                    "with std 1.0 (set model.embedding_init_std for the same init on both)")
    return config_class(
        **kw,
        transformer_impl="transformer_engine" if use_te else "local",
        params_dtype=dtype,
        pipeline_dtype=dtype,
        use_cpu_initialization=not on_gpu,
        deallocate_pipeline_outputs=True,
    )


def layer_spec(args: MegatronArgs, config, *, use_te: bool, vp_stage: int | None):
    """The layer spec Megatron-LM's ``gpt_builder`` picks: megatron-core's decoder block spec for
    MoE (dense and MoE layers by moe_layer_freq), its GPT layer spec otherwise."""
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )

    if args.num_experts:
        return get_gpt_decoder_block_spec(config, use_transformer_engine=use_te, normalization=args.normalization,
                                          vp_stage=vp_stage)
    if use_te:
        return get_gpt_layer_with_transformer_engine_spec(
            qk_layernorm=args.qk_layernorm, multi_latent_attention=args.multi_latent_attention)
    return get_gpt_layer_local_spec(qk_layernorm=args.qk_layernorm, multi_latent_attention=args.multi_latent_attention,
                                    normalization=args.normalization)


def mtp_spec(args: MegatronArgs, config, spec, *, use_te: bool, vp_stage: int | None):
    """Multi-token prediction (DeepSeek V3): the last decoder layer's spec, as Megatron-LM's gpt_builder."""
    if not args.mtp_num_layers:
        return None
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_layer_specs, get_gpt_mtp_block_spec

    if args.num_experts:
        last = get_gpt_decoder_layer_specs(config, use_transformer_engine=use_te,
                                           normalization=args.normalization)[-1]
    else:
        last = spec
    return get_gpt_mtp_block_spec(config, last, use_transformer_engine=use_te, vp_stage=vp_stage)


def parallel_sizes(args: MegatronArgs) -> dict[str, Any]:
    """megatron-core's ``parallel_state.initialize_model_parallel`` sizes, from Megatron-LM's arguments."""
    from primus.backends.megatron.validate_args import virtual_pipeline_size

    return dict(tensor_model_parallel_size=args.tensor_model_parallel_size,
                pipeline_model_parallel_size=args.pipeline_model_parallel_size,
                virtual_pipeline_model_parallel_size=virtual_pipeline_size(args),
                context_parallel_size=args.context_parallel_size,
                hierarchical_context_parallel_sizes=args.hierarchical_context_parallel_sizes,
                expert_model_parallel_size=args.expert_model_parallel_size,
                expert_tensor_parallel_size=args.expert_tensor_parallel_size)


def build_model(args: MegatronArgs, config, vocab_size: int, *, use_te: bool) -> list:
    """GPTModel chunks for this rank (one, or one per virtual pipeline stage), as Megatron-LM's gpt_builder."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    vpp = config.virtual_pipeline_model_parallel_size
    chunks = []
    for vp_stage in range(vpp or 1):
        stage = vp_stage if vpp else None
        spec = layer_spec(args, config, use_te=use_te, vp_stage=stage)
        model = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=vocab_size,
            max_sequence_length=args.max_position_embeddings,
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage),
            fp16_lm_cross_entropy=args.fp16_lm_cross_entropy,
            share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
            position_embedding_type=args.position_embedding_type,
            rotary_percent=args.rotary_percent,
            rotary_base=args.rotary_base,
            rope_scaling=args.use_rope_scaling,
            rope_scaling_factor=args.rope_scaling_factor,
            seq_len_interpolation_factor=args.rotary_seq_len_interpolation_factor,
            mtp_block_spec=mtp_spec(args, config, spec, use_te=use_te, vp_stage=stage),
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
    from megatron.core.fp8_utils import correct_amax_history_if_needed
    from megatron.core.transformer.module import Float16Module

    chunks = [Float16Module(config, chunk) for chunk in chunks]
    correct_amax_history_if_needed(chunks)  # Megatron-LM's get_model: TE < 2 FP8 params' amax after the cast
    return chunks


def wrap_ddp(args: MegatronArgs, config, chunks: list) -> list:
    """Megatron DistributedDataParallel around each chunk (bucketing only on the first, as Megatron-LM)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(
        fp8_param_gather=args.fp8_param_gather,
        grad_reduce_in_fp32=args.accumulate_allreduce_grads_in_fp32,
        overlap_grad_reduce=args.overlap_grad_reduce,
        overlap_param_gather=args.overlap_param_gather,
        use_distributed_optimizer=args.use_distributed_optimizer,
        check_for_nan_in_grad=False,  # the trainer checks the step's loss and grad norm (check_for_nan_in_loss_and_grad)
        bucket_size=args.ddp_bucket_size,
    )
    return [
        DistributedDataParallel(config=config, ddp_config=ddp_config, module=chunk, disable_bucketing=i > 0)
        for i, chunk in enumerate(chunks)
    ]


def optimizer_config(args: MegatronArgs):
    """megatron-core's OptimizerConfig, filled by field name as Megatron-LM's setup does (the precision-aware
    optimizer's dtypes as torch dtypes; ``fp8_recipe`` too: the distributed optimizer shards FP8 parameters
    by recipe)."""
    import dataclasses

    from megatron.core.optimizer import OptimizerConfig

    from primus.backends.megatron.support import IMPLEMENTED

    names = {f.name for f in dataclasses.fields(OptimizerConfig)}
    kw = {key: getattr(args, key) for key, where in IMPLEMENTED.items() if where == "OptimizerConfig" and key in names}
    kw.update({key: torch_dtype(kw[key]) for key in OPTIMIZER_DTYPES if key in kw})
    return OptimizerConfig(**kw, bf16=args.bf16, fp16=args.fp16, params_dtype=params_dtype(args),
                           fp8_recipe=args.fp8_recipe)


def build_optimizer(args: MegatronArgs, chunks: list):
    """megatron-core's optimizer for the model chunks."""
    from megatron.core.optimizer import get_megatron_optimizer

    return get_megatron_optimizer(optimizer_config(args), chunks)


# The precision-aware optimizer's dtypes, Megatron-LM strings that megatron-core's OptimizerConfig takes as torch dtypes.
OPTIMIZER_DTYPES = ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")


def torch_dtype(name: Any):
    """Megatron-LM's ``map_dtype`` (arguments.py, d3528a2): fp8 state is kept as uint8."""
    import torch

    if isinstance(name, torch.dtype):
        return name
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.uint8}[name]


def build_scheduler(args: MegatronArgs, optimizer, global_batch_size: int):
    """Megatron-LM's ``get_optimizer_param_scheduler`` (steps in samples), iteration- or sample-based."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    if args.train_samples:  # sample-based training: the schedule is in samples (Megatron-LM)
        decay_steps = args.lr_decay_samples or args.train_samples
        warmup_steps = args.lr_warmup_samples
        wd_incr_steps, wsd_decay_steps = args.train_samples, args.lr_wsd_decay_samples
    else:
        decay_steps = (args.lr_decay_iters or args.train_iters) * global_batch_size
        warmup_steps = args.lr_warmup_iters * global_batch_size
        wd_incr_steps = args.train_iters * global_batch_size
        wsd_decay_steps = args.lr_wsd_decay_iters * global_batch_size if args.lr_wsd_decay_iters else None
    if args.lr_warmup_fraction is not None:
        warmup_steps = args.lr_warmup_fraction * decay_steps
    return OptimizerParamScheduler(
        optimizer,
        init_lr=args.lr_warmup_init,
        max_lr=args.lr,
        min_lr=args.min_lr,
        lr_warmup_steps=warmup_steps,
        lr_decay_steps=decay_steps,
        lr_decay_style=args.lr_decay_style,
        start_wd=args.start_weight_decay,
        end_wd=args.end_weight_decay,
        wd_incr_steps=wd_incr_steps,
        wd_incr_style=args.weight_decay_incr_style,
        use_checkpoint_opt_param_scheduler=args.use_checkpoint_opt_param_scheduler,
        override_opt_param_scheduler=args.override_opt_param_scheduler,
        wsd_decay_steps=wsd_decay_steps,
        lr_wsd_decay_style=args.lr_wsd_decay_style,
    )
