"""What Primus's Megatron backend does with each Megatron-LM argument: exactly one class each.

- **implemented**: mapped onto megatron-core objects by our trainer (``IMPLEMENTED`` says where);
- **kernel-only**: a fusion, kernel, communication-overlap, logging or infrastructure choice with
  no effect on the math here; accepted, and at run time a non-default value is said in one
  ``derived`` line, never silently dropped;
- **refused**: a non-default value would change the math, the parallel layout or the precision
  and cannot be honoured here (another model family, sample-based schedules ...): admission
  (``admission.py``: ``config validate``, ``plan``, ``train --dry-run`` and the launch alike) stops
  with exit 2 and one line. Arguments whose support depends on the device (FP8, FSDP, context
  parallelism ...) are decided per target by ``primus.runtime.capabilities`` instead.

The classes come from hand-kept lists, then rules over Megatron-LM's argument groups; an
argument nobody listed is refused (never silently ignored). Tests check that every row of the
generated table lands in exactly one class.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from primus.backends.megatron.schema import megatron_lm_table
from primus.backends.megatron.te_features import TE_ARGS

IMPLEMENTED_KIND, KERNEL_ONLY_KIND, REFUSED_KIND = "implemented", "kernel-only", "refused"

# dest -> what consumes it. "TransformerConfig"/"OptimizerConfig"/"DDPConfig" keys are passed by
# name, as Megatron-LM's core_transformer_config_from_args does; the rest are read explicitly.
_TC, _OPT, _DDP = "TransformerConfig", "OptimizerConfig", "DDPConfig"
TE_CONSUMER = "TransformerConfig via te_features (Transformer Engine on a GPU)"
IMPLEMENTED: dict[str, str] = {
    **dict.fromkeys((
        "tensor_model_parallel_size", "pipeline_model_parallel_size", "sequence_parallel",
        "expert_model_parallel_size", "expert_tensor_parallel_size", "perform_initialization", "fp16", "bf16",
        "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "kv_channels",
        "hidden_dropout", "attention_dropout", "fp32_residual_connection", "apply_residual_connection_post_layernorm",
        "layernorm_epsilon", "layernorm_zero_centered_gamma", "add_bias_linear", "add_qkv_bias", "normalization",
        "qk_layernorm", "multi_latent_attention", "init_method_std", "embedding_init_method_std",
        "apply_query_key_layer_scaling", "attention_softmax_in_fp32", "rotary_interleaved",
        "recompute_granularity", "recompute_method", "recompute_num_layers", "distribute_saved_activations",
        "recompute_modules", "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
        "microbatch_group_size_per_vp_stage", "clone_scatter_output_in_embedding", "calculate_per_token_loss",
        # attention sinks (gpt-oss) and sliding windows: megatron-core's DotProductAttention (and TE's)
        "softmax_type", "window_size", "window_attn_skip_freq",
        # MoE
        "moe_layer_freq", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_shared_expert_gate",
        "moe_router_topk", "moe_router_num_groups", "moe_router_group_topk", "moe_router_pre_softmax",
        "moe_router_topk_scaling_factor", "moe_router_score_function", "moe_router_dtype",
        "moe_router_enable_expert_bias", "moe_router_bias_update_rate", "moe_router_force_load_balancing",
        "moe_router_load_balancing_type", "moe_aux_loss_coeff", "moe_z_loss_coeff", "moe_input_jitter_eps",
        "moe_token_dispatcher_type", "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity",
        "moe_token_drop_policy", "moe_layer_recompute", "moe_apply_probs_on_input",
        # MLA (MLATransformerConfig) and multi-token prediction
        "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "rope_type",
        "rotary_scaling_factor", "mscale", "mscale_all_dim", "mtp_num_layers", "mtp_loss_scaling_factor",
        # megatron-core places the layers (get_num_layers_to_build / get_layer_offset / mtp_on_this_rank)
        "pipeline_model_parallel_layout",
    ), _TC),
    # TransformerConfig fields Megatron-LM fills from differently named arguments (model.py)
    **dict.fromkeys(("num_experts", "group_query_attention", "swiglu", "squared_relu", "quick_geglu",
                     "init_method_xavier_uniform", "decoder_first_pipeline_num_layers",
                     "decoder_last_pipeline_num_layers", "num_layers_per_virtual_pipeline_stage",
                     "num_virtual_stages_per_pipeline_rank", "encoder_num_layers"), "TransformerConfig (renamed)"),
    **dict.fromkeys(("position_embedding_type", "use_rotary_position_embeddings", "rotary_base", "rotary_percent",
                     "rotary_seq_len_interpolation_factor", "use_rope_scaling", "rope_scaling_factor",
                     "max_position_embeddings", "untie_embeddings_and_output_weights", "fp16_lm_cross_entropy",
                     "vocab_size", "make_vocab_size_divisible_by",
                     "add_position_embedding"), "GPTModel"),  # False: only with rope (validate_args), a no-op there
    **dict.fromkeys(("lr", "min_lr", "decoupled_lr", "decoupled_min_lr", "weight_decay", "apply_wd_to_qk_layernorm",
                     "optimizer", "adam_beta1", "adam_beta2", "adam_eps", "sgd_momentum", "clip_grad",
                     "loss_scale", "initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis",
                     "use_distributed_optimizer", "overlap_param_gather",
                     # on Transformer Engine's FusedAdam: admitted per target (admission.py, capabilities)
                     "use_precision_aware_optimizer", "main_grads_dtype", "main_params_dtype", "exp_avg_dtype",
                     "exp_avg_sq_dtype"), _OPT),
    **dict.fromkeys(("overlap_grad_reduce", "accumulate_allreduce_grads_in_fp32", "grad_reduce_in_bf16",
                     "ddp_bucket_size"), _DDP),
    **dict.fromkeys(("lr_decay_style", "lr_decay_iters", "lr_warmup_iters", "lr_warmup_fraction", "lr_warmup_init",
                     "lr_wsd_decay_style", "lr_wsd_decay_iters", "start_weight_decay", "end_weight_decay",
                     "weight_decay_incr_style", "override_opt_param_scheduler",
                     "use_checkpoint_opt_param_scheduler", "train_samples", "lr_decay_samples", "lr_warmup_samples",
                     "lr_wsd_decay_samples"), "OptimizerParamScheduler"),
    **dict.fromkeys(("micro_batch_size", "global_batch_size", "train_iters", "seed", "data_parallel_random_init",
                     "recompute_activations", "eval_iters", "eval_interval", "enable_experimental",
                     "exit_duration_in_mins", "check_for_nan_in_loss_and_grad"), "trainer"),
    **dict.fromkeys(("mock_data", "data_path", "split", "train_data_path", "valid_data_path", "test_data_path",
                     "data_cache_path", "reset_position_ids", "reset_attention_mask", "eod_mask_loss", "seq_length",
                     "encoder_seq_length", "create_attention_mask_in_dataloader", "mmap_bin_files",
                     "num_dataset_builder_threads", "mid_level_dataset_surplus", "dataloader_type", "data_sharding",
                     "tokenizer_type", "tokenizer_model", "vocab_file", "merge_file", "tokenizer_special_tokens",
                     "tiktoken_pattern", "tiktoken_num_special_tokens", "tiktoken_special_tokens",
                     "tokenizer_sentencepiece_legacy"), "data"),
    **dict.fromkeys(("save", "load", "save_interval", "finetune", "no_load_optim", "no_load_rng", "no_save_optim",
                     "no_save_rng", "ckpt_format", "exit_on_missing_checkpoint", "async_save",
                     "use_persistent_ckpt_worker", "pretrained_checkpoint", "dist_ckpt_workers"), "checkpoint"),
    # admitted per target: rows megatron.torch_fsdp2 / megatron.megatron_fsdp (admission.py, capabilities)
    **dict.fromkeys(("use_torch_fsdp2", "torch_fsdp2_reshard_after_forward", "use_megatron_fsdp",
                     "data_parallel_sharding_strategy"), "fsdp"),
    # FP8 and context parallelism: admitted where the target has a GPU with Transformer Engine (te_features.py)
    **dict.fromkeys(TE_ARGS, TE_CONSUMER),
}

# Values of implemented arguments this backend runs; any other (valid Megatron-LM) value is refused.
SUPPORTED_VALUES: dict[str, tuple[set, str]] = {
    "optimizer": ({"adam", "sgd"}, "megatron-core's Adam and SGD are wired here"),
    "tokenizer_type": ({None, "HuggingFaceTokenizer", "GPT2BPETokenizer", "Llama2Tokenizer", "SentencePieceTokenizer",
                        "GPTSentencePieceTokenizer", "TikTokenizer", "NullTokenizer"},
                       "the tokenizers that read local files are wired here (tokenizers.py)"),
    "position_embedding_type": ({"learned_absolute", "rope", "none"},
                                "mrope and relative embeddings need other model code / Transformer Engine"),
    "moe_token_dispatcher_type": ({"allgather", "alltoall"}, "the flex dispatcher needs DeepEP on GPUs"),
    "ckpt_format": ({"torch_dist", "torch", "torch_dcp", "fsdp_dtensor"},
                    "megatron-core dist_checkpointing (torch_dist), Megatron-LM's legacy per-rank files (torch) "
                    "and Megatron-FSDP's DCP checkpoints (fsdp_dtensor), each per target (primus.runtime.capabilities)"),
    "dataloader_type": ({None, "single", "cyclic"},
                        "Megatron-LM's pretraining and random (cyclic) samplers run here; external needs your code"),
    "rope_type": ({None, "rope", "yarn"}, "megatron-core's RoPE and YaRN"),
}


@dataclass(frozen=True)
class Support:
    kind: str  # implemented | kernel-only | refused
    reason: str


_FUSION = "a fused kernel for the same math; Primus uses the kernel installed here"
_OVERLAP = "communication overlap or scheduling: the same math, in another order of launches"
_OFFLOAD = "memory placement (offload, pinning, allocator): the same math"
_INFRA = "infrastructure Primus provides itself (logs, metrics, profiling, fault handling)"
_CKPT_IO = "checkpoint I/O strategy: the same state is saved"
_CHECK = "a diagnostic check with no effect on the update"

KERNEL_ONLY: dict[str, str] = {
    **dict.fromkeys((
        "masked_softmax_fusion", "bias_gelu_fusion", "bias_swiglu_fusion", "bias_dropout_fusion",
        "apply_rope_fusion", "gradient_accumulation_fusion", "no_persist_layer_norm", "cross_entropy_loss_fusion",
        "cross_entropy_fusion_impl", "moe_permute_fusion", "moe_router_fusion", "gradient_reduce_div_fusion",
        "use_fused_weighted_squared_relu", "use_te_activation_func", "disable_jit_fuser", "use_flash_attn",
        "attention_backend", "transformer_impl", "moe_grouped_gemm", "disable_bf16_reduced_precision_matmul",
        "batch_invariant_mode", "deterministic_mode", "moe_deepep_num_sms", "moe_hybridep_num_sms",
        "moe_flex_dispatcher_backend", "moe_router_padding_for_fp8", "moe_router_padding_for_quantization",
        "keep_fp8_transpose_cache", "deprecated_use_mcore_models", "use_dist_ckpt_deprecated",
    ), _FUSION),
    **dict.fromkeys((
        "tp_comm_overlap", "tp_comm_bulk_wgrad", "tp_comm_bulk_dgrad", "tp_comm_overlap_ag", "tp_comm_overlap_rs",
        "tp_comm_overlap_rs_dgrad", "tp_comm_split_ag", "tp_comm_split_rs", "tp_comm_bootstrap_backend",
        "tp_comm_overlap_cfg", "overlap_moe_expert_parallel_comm", "delay_wgrad_compute",
        "ep_overlap_early_attn_memory_release", "use_ring_exchange_p2p", "defer_embedding_wgrad_compute",
        "wgrad_deferral_limit", "overlap_p2p_comm_warmup_flush", "overlap_p2p_comm", "align_grad_reduce",
        "align_param_gather", "scatter_gather_tensors_in_pipeline", "overlap_param_gather_with_optimizer_step",
        "moe_shared_expert_overlap", "ddp_num_buckets", "ddp_pad_buckets_for_high_nccl_busbw",
        "ddp_reduce_scatter_with_fp32_accumulation", "ddp_average_in_collective", "nccl_ub",
        "disable_symmetric_registration", "fsdp_manual_registration", "create_all_gather_group",
        "suggested_communication_unit_size", "high_priority_stream_groups", "use_sharp", "sharp_enabled_group",
        "nccl_communicator_config_path", "distributed_backend", "pipeline_model_parallel_comm_backend",
        "symmetric_ar_type", "use_tp_pp_dp_mapping", "enable_cuda_graph", "external_cuda_graph",
        "cuda_graph_impl", "cuda_graph_scope", "cuda_graph_warmup_steps", "train_sync_interval",
    ), _OVERLAP),
    **dict.fromkeys((
        "optimizer_cpu_offload", "optimizer_offload_fraction", "use_torch_optimizer_for_cpu_offload",
        "overlap_cpu_optimizer_d2h_h2d", "pin_cpu_grads", "pin_cpu_params", "cpu_offloading_num_layers",
        "fine_grained_activation_offloading", "offload_modules", "min_offloaded_tensor_size",
        "init_model_with_meta_device", "use_cpu_initialization", "empty_unused_memory_level", "manual_gc",
        "manual_gc_interval", "manual_gc_eval", "num_workers", "dataloader_fast_cache_load",
        "dataloader_defer_npy_index_mmap", "lazy_mpu_init",
    ), _OFFLOAD),
    **dict.fromkeys((
        "distributed_timeout_minutes", "distributed_timeout_seconds_after_init", "local_rank",
        "enable_gloo_process_groups", "exit_signal_handler", "exit_signal", "exit_signal_handler_for_dataloader",
        "config_logger_dir", "dump_param_to_param_group_map", "moe_per_layer_logging", "rerun_mode",
        "tokenizer_hf_use_fast", "tokenizer_hf_include_special_tokens", "tokenizer_hf_no_use_fast",
        "tokenizer_hf_no_include_special_tokens", "trust_remote_code", "use_tokenizer_model_from_checkpoint_args",
    ), _INFRA),
    **dict.fromkeys((
        "ckpt_fully_parallel_save", "ckpt_fully_parallel_load",
        "ckpt_fully_parallel_load_exchange_algo", "ckpt_fully_parallel_save_process_group",
        "ckpt_fully_parallel_load_process_group", "ckpt_assume_constant_structure", "dist_ckpt_strictness",
        "ckpt_fully_parallel_save_deprecated", "auto_detect_ckpt_format",
        "save_retain_interval",
    ), _CKPT_IO),
    **dict.fromkeys(("check_weight_hash_across_dp_replicas_interval", "check_for_large_grads",
                     "check_for_spiky_loss"), _CHECK),
}

_TE_PRECISION = ("FP4, quantizer factories and per-module precision recipes are not wired here (FP8 and the "
                 "precision-aware optimizer are, on a GPU with Transformer Engine)")
_LAYOUT = "another parallel or sharding layout than Primus's Megatron trainer builds"
_FAMILY = "another model family or attention variant than the GPT/MoE/MLA models built here"
_SCHEDULE = "batch-size ramp-ups, phased or partial schedules: Primus's Megatron trainer runs a fixed global batch"
_DEPRECATED = "no longer valid in Megatron-LM"
REFUSED: dict[str, str] = {
    **dict.fromkeys((
        "fp8_quantizer_factory", "fp4", "fp4_recipe", "fp4_param",
        "fp4_quantizer_factory", "te_precision_config_file", "reuse_grad_buf_for_mxfp8_param_ag",
        "use_kitchen_attention", "kitchen_attention_backend", "te_rng_tracker",
    ), _TE_PRECISION),
    **dict.fromkeys((
        "max_seqlen_per_dp_cp_rank", "hybrid_context_parallel", "outer_dp_sharding_strategy", "fsdp_double_buffer",
        "enable_full_sharding_in_hsdp", "num_distributed_optimizer_instances",
        "fake_process_group", "dist_ckpt_optim_fully_reshardable", "distrib_optim_fully_reshardable_mem_efficient",
    ), _LAYOUT),
    **dict.fromkeys(("megatron_fsdp_main_params_dtype", "megatron_fsdp_main_grads_dtype",
                     "megatron_fsdp_grad_comm_dtype"),
                    "megatron-core 0.16's Megatron-FSDP takes no mixed-precision dtypes (a later Megatron-LM argument)"),
    **dict.fromkeys((
        "experimental_attention_variant", "qk_l2_norm", "qk_clip", "qk_clip_alpha",
        "qk_clip_threshold", "attention_output_gate", "glu_linear_offset", "activation_func_clamp_value",
        "no_rope_freq", "is_hybrid_model", "use_mamba_mem_eff_path",
        "mrope_section", "moe_latent_size", "moe_enable_routing_replay", "moe_use_upcycling",
        "moe_upcycling_granularity", "moe_enable_deepep", "mtp_standalone", "mtp_use_repeated_layer",
        "mtp_hybrid_override_pattern", "spec", "hybrid_layer_pattern",
        "hybrid_override_pattern", "yaml_cfg", "openai_gelu", "onnx_safe", "bert_binary_head",
        "relative_attention_num_buckets", "relative_attention_max_distance",
        "use_legacy_models", "decoder_num_layers", "decoder_seq_length", "cache_mla_latents",
        "flash_decode", "mlp_chunks_for_prefill", "nccl_all_reduce_for_prefill", "inference_fuse_tp_communication",
        "inference_disable_triton_nvls_kernels", "inference_disable_torch_grouped_mm",
        "moe_pad_experts_for_cuda_graph_inference", "inference_rng_tracker",
    ), _FAMILY),
    **dict.fromkeys((
        "rampup_batch_size", "decrease_batch_size_if_needed", "phase_transition_iterations", "iterations_to_skip",
        "exit_interval", "skip_train", "full_validation", "multiple_validation_sets", "test_mode",
    ), _SCHEDULE),
    **dict.fromkeys(("batch_size", "warmup", "model_parallel_size", "checkpoint_activations",
                     "no_weight_decay_cond_type"), _DEPRECATED),
    **dict.fromkeys((
        "data_args_path", "per_split_data_args_path", "per_dataset_sequences_path", "object_storage_cache_path",
        "vocab_extra_ids", "tokenizer_metadata", "sample_rate", "mask_prob", "short_seq_prob",
        "allow_ambiguous_pad_tokens", "padded_vocab_size",
    ), "a data or tokenizer path not wired here (indexed .bin/.idx with a Hugging Face tokenizer, or mock data)"),
    **dict.fromkeys((
        "ckpt_step", "use_checkpoint_args", "use_mp_args_from_checkpoint_args",
        "load_main_params_from_ckpt", "non_persistent_save_interval", "non_persistent_ckpt_type",
        "non_persistent_global_ckpt_dir", "non_persistent_local_ckpt_dir", "non_persistent_local_ckpt_algo",
        "ckpt_convert_format", "ckpt_convert_save", "ckpt_convert_update_legacy_dist_opt_format",
        "dist_ckpt_format_deprecated", "dist_ckpt_save_pre_mcore_014", "strict_fsdp_dtensor_load",
        "save_wgrads_interval", "save_dgrads_interval", "replication", "replication_jump", "replication_factor",
    ), "a checkpoint mode not wired here (save/load of torch_dist checkpoints is)"),
    **dict.fromkeys(("error_injection_rate", "error_injection_type", "result_rejected_tracker_filename"),
                    "fault injection / result replay would change the run"),
}

# Kernel-only arguments the trainer honours where the kernel exists and always says what it chose
# (model.py: fusion_flags, use_transformer_engine, grouped experts): no second, generic line.
SAID_BY_TRAINER = frozenset({
    "transformer_impl", "moe_grouped_gemm", "masked_softmax_fusion", "bias_gelu_fusion", "bias_swiglu_fusion",
    "bias_dropout_fusion", "apply_rope_fusion", "gradient_accumulation_fusion", "no_persist_layer_norm",
})

# Argument groups (the ``_add_*_args`` function or config dataclass) classified as a whole.
_KERNEL_ONLY_GROUPS = {
    "ProfilingConfig": _INFRA, "LoggerConfig": _INFRA, "StragglerDetectionConfig": _INFRA,
    "workload_inspector_server": _INFRA, "one_logger": _INFRA, "inprocess_restart": _INFRA, "ft_package": _INFRA,
    "msc": _INFRA, "autoresume": _INFRA, "RerunStateMachineConfig": _INFRA,
}
_REFUSED_GROUPS = {
    "rl": "reinforcement learning (GRPO) is not a pretraining path here",
    "inference": "inference serving options: Primus trains",
    "biencoder": _FAMILY, "vision": _FAMILY, "heterogeneous": _FAMILY, "experimental_attention_variant": _FAMILY,
    "sft": "Megatron-LM's SFT path is not wired here",
}
_REFUSED_PATTERNS = [
    (re.compile(r"^(muon_|mup_|use_mup$|mamba_|dsa_|linear_|fim_|inference_|rl_)"), _FAMILY),
]
_NOT_WIRED = "not implemented by Primus's Megatron backend"


def _explicit_lists() -> list[tuple[str, dict[str, str]]]:
    return [(IMPLEMENTED_KIND, IMPLEMENTED), (KERNEL_ONLY_KIND, KERNEL_ONLY), (REFUSED_KIND, REFUSED)]


@cache
def classify(dest: str) -> Support:
    """The one class of a Megatron-LM argument: explicit lists first, then group rules."""
    for kind, table in _explicit_lists():
        if dest in table:
            return Support(kind, table[dest])
    group = megatron_lm_table()[dest].group
    if group in _KERNEL_ONLY_GROUPS:
        return Support(KERNEL_ONLY_KIND, _KERNEL_ONLY_GROUPS[group])
    if group in _REFUSED_GROUPS:
        return Support(REFUSED_KIND, _REFUSED_GROUPS[group])
    for pattern, reason in _REFUSED_PATTERNS:
        if pattern.search(dest):
            return Support(REFUSED_KIND, reason)
    return Support(REFUSED_KIND, _NOT_WIRED)
