"""AMD Primus's Megatron keys that are not Megatron-LM (d3528a2) arguments, and what each does here.

Read from AMD Primus fd1eeab: ``primus/configs/modules/megatron/{trainer_base, primus_megatron_module,
primus_turbo, torch_compile, zero_bubble, primus_pipeline, sft_trainer}.yaml``,
``primus/configs/modules/module_base.yaml`` and ``primus/configs/models/megatron/*.yaml``.
``tests/compat/test_megatron_table.py`` checks (with the AMD mirror) that every such key is here
or in the generated Megatron-LM table, and prints what each key does.

Megatron-LM's own arguments are not here: the Megatron backend's argument table owns them, by dest
or by option spelling (``norm_epsilon`` is ``--norm-epsilon``, whose dest is ``layernorm_epsilon``).
"""
from __future__ import annotations

from typing import Any

from primus.compat import differs
from primus.compat.rules import custom, inert, kernel, negated, rename, switch, table, unsupported

TURBO = "Primus-Turbo kernel switch"
STALE = "not a Megatron-LM d3528a2 argument (AMD Primus's trainer_base.yaml still lists it); no effect"
PIPELINE = "AMD Primus's own pipeline schedule; Megatron's 1F1B / interleaved schedule runs here"

# AMD Primus's tokenizer types are names for Megatron-LM's HuggingFaceTokenizer on the model's
# Hub tokenizer (primus/backends/megatron/training/tokenizer/tokenizer.py, CUSTOM_TOKENIZER_TYPES).
AMD_TOKENIZER_TYPES = frozenset({
    "DeepSeekV2Tokenizer", "DeepSeekV3Tokenizer", "DeepSeekV4Tokenizer", "Llama2Tokenizer", "Llama3Tokenizer",
    "Llama4Tokenizer", "MixtralTokenizer", "Lfm2Tokenizer", "KimiK2Tokenizer", "Qwen2Tokenizer",
    "Qwen3Tokenizer", "GptOssTokenizer", "GrokTokenizer",
})


def _tokenizer_type(value: Any, ctx, key: str) -> None:
    # Llama2Tokenizer is Megatron-LM's own type too: a sentencepiece ``.model`` file keeps Megatron-LM's meaning
    megatron_lm = value == "Llama2Tokenizer" and str(ctx.get("tokenizer_model") or "").endswith(".model")
    if value not in AMD_TOKENIZER_TYPES or megatron_lm:
        ctx.params[key] = value  # a Megatron-LM type: the Megatron table checks it
        return
    ctx.set(key, "HuggingFaceTokenizer", key, f"AMD Primus's {value} is HuggingFaceTokenizer on "
            f"tokenizer_model={ctx.get('tokenizer_model')!s} (a Hub id is fetched once into the HF cache)")


def _auto_continue(value: Any, ctx, key: str) -> None:
    try:
        on = switch(value)
    except ValueError as exc:
        raise ctx.fail(key, str(exc)) from None
    if on:
        ctx.set(key, "always", "primus.resume", "AMD Primus auto_continue_train: continue from the run's latest "
                                                "checkpoint, even a completed run (like --resume)")
    else:
        ctx.note(key, value, "Primus's resume policy: an interrupted run resumes, a completed one is refused, "
                             "a new one starts fresh")


def _torch_compile(value: Any, ctx, key: str) -> None:
    enabled = isinstance(value, dict) and value.get("enable")
    ctx.note(key, value, "AMD Primus's torch.compile of the Megatron model is not applied here (stock eager "
                         "kernels; same math)" if enabled else "torch.compile off", kind="kernel" if enabled else "inert")


def _lora(value: Any, ctx, key: str) -> None:
    """AMD Primus's LoRA block is also Primus's: it stays for the Megatron backend, whose lora recipe reads
    and checks it (primus/backends/megatron/recipes/lora.py); a block that is off is said so here."""
    if not (isinstance(value, dict) and value.get("enabled") is True):
        ctx.note(key, value, "LoRA off")
    ctx.params[key] = value


def _mock_dataset(value: Any, ctx, key: str) -> None:
    if isinstance(value, dict) and value.get("class"):
        raise ctx.fail(key, f"AMD Primus's synthetic dataset {value['class']} (Flux/diffusion) is not supported: "
                            "Primus's Megatron backend trains GPT models (mock_data: true gives random tokens)")
    ctx.note(key, value, "no custom synthetic dataset: mock_data: true gives Megatron's mock GPT dataset")


def _model_type(value: Any, ctx, key: str) -> None:
    if value in (None, "gpt"):
        ctx.note(key, value, "Primus's Megatron backend builds megatron-core GPTModel")
        return
    raise ctx.fail(key, f"model_type '{value}' is not supported: Primus's Megatron backend builds megatron-core "
                        f"GPT models (no Mamba/hybrid, Flux or other diffusion models)")


# Megatron-LM's defaults (d3528a2) of the dests AMD's option spellings store (tests/compat/test_amd_keys.py
# holds them to backends/megatron's argument table; compat sits below the backends and reads none of them).
OPTION_DEFAULTS = {"layernorm_epsilon": 1e-5, "layernorm_zero_centered_gamma": False}


def _option_spelling(dest: str, option: str):
    """Megatron-LM's option spelling of an argument (``norm_epsilon`` for ``--norm-epsilon``, whose dest is
    ``layernorm_epsilon``). A Primus experiment gets it under the dest (the later layer wins; in one file
    both, the dest wins). AMD Primus hands Megatron-LM argument dests only (its MegatronArgBuilder drops any
    other key), so in an AMD Primus-format file (primus/compat/dialect.py) it does not run, here neither:
    said in a ``differs:`` line when its value is not what runs."""
    def apply(value: Any, ctx, key: str) -> None:
        if ctx.amd_format:
            _dropped(value, ctx, key)
            return
        here, there = ctx.last_source(key), ctx.last_source(dest)
        if dest in ctx.params and here is not None and there is not None and there.label == here.label:
            ctx.note(key, value, f"Megatron-LM's {option} stores {dest}, which {there.where} sets: it wins")
            return
        ctx.set(key, value, dest, f"Megatron-LM's {option} stores {dest}")

    def _dropped(value: Any, ctx, key: str) -> None:
        runs = ctx.get(dest, OPTION_DEFAULTS[dest])
        why = (f"AMD Primus drops {key}: not a Megatron-LM d3528a2 argument dest ({option} stores {dest}); "
               f"write {dest} to set it")
        if value == runs:
            ctx.note(key, value, why)
        else:
            differs.record(ctx, key, value, dest, runs, why)
    return apply


def _activation_func(value: Any, ctx, key: str) -> None:
    if str(value).lower() in ("swiglu", "silu"):
        ctx.set(key, True, "swiglu", "AMD Primus's activation_func: swiglu is Megatron-LM's --swiglu")
    elif str(value).lower() == "gelu":
        ctx.note(key, value, "GeLU is Megatron-LM's default activation")
    else:
        raise ctx.fail(key, f"activation '{value}': give Megatron-LM's switch (swiglu, squared_relu, quick_geglu)")


def _fp4_recipe(value: Any, ctx, key: str) -> None:
    if value in ("nvfp4", "custom", None):  # Megatron-LM's own choices: its table checks them
        ctx.params[key] = value
        return
    ctx.note(key, value, f"AMD Primus's {value} FP4 recipe needs Primus-Turbo", kind="refuse_at_run")


def _recompute_layer_ids(value: Any, ctx, key: str) -> None:
    """AMD recomputes the listed layers only; Megatron-LM's closest is every layer (same math, more compute)."""
    if value is None:
        ctx.note(key, value, "recomputation follows recompute_granularity / recompute_method")
        return
    if ctx.get("recompute_granularity") != "full" or ctx.get("recompute_method") is not None:
        raise ctx.fail(key, "AMD Primus reads it with recompute_granularity: full and recompute_method: null")
    why = (f"AMD Primus recomputes layers {value} only; Megatron-LM's closest recomputes every layer (same math, "
           f"more recomputation)")
    ctx.set(key, "uniform", "recompute_method", why)
    ctx.set(key, 1, "recompute_num_layers", why)


def _conversation_format(value: Any, ctx, key: str) -> None:
    """AMD Primus's ``messages`` format is the tokenizer's chat template; other values go to the backend."""
    if value in ("messages", "openai"):
        ctx.set(key, "chat_template", key, f"AMD Primus's {value} format renders with the tokenizer's chat template")
    elif value == "bridge_squad":
        ctx.set(key, "squad", key, "AMD Primus's bridge_squad is its squad format (Megatron-Bridge's wording)")
    else:
        ctx.params[key] = value


def _family(prefix: str, family: str):
    return unsupported(prefix, f"{family} models are not supported by Primus's Megatron backend (megatron-core "
                               f"GPT models only)", off=(None,), when="resolve")


RULES = table(
    # -- Megatron-LM options AMD Primus's experiments spell by option name while our model presets
    # use the argument's dest: the later layer must win, as for any key (the backend takes either) --
    custom("norm_epsilon", "option spelling", _option_spelling("layernorm_epsilon", "--norm-epsilon")),
    custom("apply_layernorm_1p", "option spelling",
           _option_spelling("layernorm_zero_centered_gamma", "--apply-layernorm-1p")),
    rename("check_for_nan_in_loss", "check_for_nan_in_loss_and_grad", "Megatron-LM's argument for it"),
    custom("activation_func", "the MLP activation", _activation_func),
    # -- logging and metrics (primus_megatron_module.yaml, trainer_base.yaml) ------------------
    rename("log_avg_skip_iterations", "primus.avg_skip_steps", "[TRAIN] averages skip the first N steps"),
    rename("log_avg_reset_interval", "primus.avg_window", "[TRAIN] averages over a window of N steps"),
    rename("disable_tensorboard", "primus.tensorboard", "TensorBoard event files in the run dir",
           convert=negated),
    rename("disable_wandb", "primus.wandb", "W&B on/off (with Megatron-LM's wandb_project)", convert=negated),
    rename("disable_mlflow", "primus.mlflow", "MLflow on/off", convert=negated),
    rename("mlflow_run_name", "primus.mlflow_run_name", "the MLflow run's name"),
    rename("mlflow_experiment_name", "primus.mlflow_experiment_name", "the MLflow experiment"),
    inert("mlflow_upload_traces", "MLflow tracking is not built in"),
    inert("mlflow_upload_logs", "MLflow tracking is not built in"),
    inert("mlflow_upload_performance_metrics", "MLflow tracking is not built in"),
    inert("generate_tracelens_report", "TraceLens reports are AMD Primus tooling"),
    inert("mlflow_upload_tracelens_report", "TraceLens reports are AMD Primus tooling"),
    inert("mlflow_tracelens_ranks", "TraceLens reports are AMD Primus tooling"),
    inert("mlflow_tracelens_output_format", "TraceLens reports are AMD Primus tooling"),
    inert("mlflow_tracelens_cleanup_after_upload", "TraceLens reports are AMD Primus tooling"),
    inert("mlflow_tracelens_auto_install", "TraceLens reports are AMD Primus tooling"),
    inert("disable_compile_dependencies", "AMD Primus build switch"),
    inert("use_rocm_mem_info", "[TRAIN] mem= is the peak device memory on every step"),
    inert("use_rocm_mem_info_iters", "[TRAIN] mem= is the peak device memory on every step"),
    inert("disable_profiler_activity_cpu", "AMD Primus torch-profiler option"),
    inert("torch_profiler_record_shapes", "AMD Primus torch-profiler option"),
    inert("torch_profiler_with_stack", "AMD Primus torch-profiler option"),
    inert("torch_profiler_use_gzip", "AMD Primus torch-profiler option"),
    inert("wall_clock_step_timer", "[TRAIN] step_time is wall-clock time per step"),
    inert("dump_pp_data", "AMD Primus debugging dump"),
    inert("use_nsys_profiler", "Nsight Systems profiling is not built into Primus"),
    inert("record_shapes", "AMD Primus torch-profiler option"),
    inert("nvtx_ranges", "AMD Primus NVTX ranges"),
    inert("disable_delayed_scaling_patches", "AMD Primus's own FP8 delayed-scaling patches are not applied here"),
    inert("moe_router_topk_limited_devices", "gone from Megatron-LM (moe_router_num_groups / moe_router_group_topk)"),
    unsupported("moe_token_dropping", "gone from Megatron-LM (moe_expert_capacity_factor drops tokens)",
                when="resolve"),
    custom("fp4_recipe", "FP4 recipe", _fp4_recipe),
    # -- checkpoints and resume ----------------------------------------------------------------
    custom("auto_continue_train", "the resume policy", _auto_continue),
    rename("disable_last_saving", "primus.save_last_checkpoint", "no checkpoint at the last step (Megatron backend; "
           "a preemption still saves)", convert=negated),
    # -- kernels (primus_turbo.yaml and friends): same math, stock kernels here ----------------
    kernel("enable_primus_turbo", TURBO),
    kernel("use_turbo_autotune", TURBO),
    kernel("turbo_gemm_backend", TURBO, off=("default", None)),
    kernel("turbo_grouped_gemm_backend", TURBO, off=("default", None)),
    kernel("use_turbo_attention", TURBO),
    kernel("use_turbo_gemm", TURBO),
    kernel("use_turbo_grouped_gemm", TURBO),
    kernel("turbo_grouped_gemm_without_padding", TURBO),
    kernel("use_turbo_fused_act_with_probs", TURBO),
    kernel("moe_use_fused_router_with_aux_score", TURBO),
    kernel("use_turbo_deepep", TURBO),
    inert("turbo_deepep_num_cu", "Primus-Turbo DeepEP tuning"),
    inert("turbo_deepep_use_comm_stream", "Primus-Turbo DeepEP tuning"),
    kernel("turbo_sync_free_moe_stage", TURBO),
    kernel("use_turbo_mega_moe", TURBO),
    inert("turbo_mega_moe_precision", "read only with use_turbo_mega_moe"),
    kernel("use_turbo_rms_norm", TURBO),
    kernel("use_turbo_norm_te_linear", TURBO),
    kernel("use_turbo_grouped_mlp", TURBO),
    kernel("use_turbo_permute_padding", TURBO),
    kernel("moe_use_legacy_grouped_gemm", "AMD Primus's legacy grouped-GEMM switch (Megatron's grouped GEMM or "
                                          "sequential experts run here)"),
    kernel("no_fp8_weight_transpose_cache", "Transformer Engine FP8 weight-cache switch"),
    unsupported("enable_turbo_attention_float8", "FP8 attention needs Primus-Turbo (changes precision)"),
    unsupported("mxfp4_gradient_stochastic_rounding", "MXFP4 stochastic rounding needs Primus-Turbo"),
    rename("use_sink_attention", "softmax_type", "gpt-oss's learned attention sinks are megatron-core's "
           "softmax_type: learnable (one learned logit per head in the softmax's denominator)",
           convert=lambda on: "learnable" if on else "vanilla"),
    unsupported("sink_sliding_window", "gpt-oss sliding-window sink attention needs Primus-Turbo"),
    inert("sink_window_even_layers_only", "read only with use_sink_attention"),
    custom("torch_compile", "AMD Primus torch.compile of the model", _torch_compile),
    # -- pipeline schedules (zero_bubble.yaml, primus_pipeline.yaml) ---------------------------
    kernel("patch_zero_bubble", PIPELINE),
    kernel("patch_primus_pipeline", PIPELINE),
    kernel("pp_warmup", "AMD Primus pipeline warm-up (first-iteration time only)"),
    kernel("patch_moe_overlap", "AMD Primus MoE communication overlap"),
    *(inert(key, "read only with patch_zero_bubble / patch_primus_pipeline") for key in (
        "enable_zb_runtime", "pre_communication_optimization", "zero_bubble_pipeline_timers_start_iter",
        "zero_bubble_pipeline_timers_end_iter", "zero_bubble_max_pending_backward",
        "zero_bubble_adaptive_memory_limit_percentile", "enable_optimizer_post_validation",
        "enable_exactly_numeric_match", "enable_zero_bubble", "zero_bubble_v_schedule",
        "zero_bubble_v_schedule_mem_setup", "enable_1f1b_v", "allow_padding_num_layers", "profile_memory_iter",
        "interleave_group_size", "offload_chunk_num", "offload_time", "auto_offload_time", "offload_overlap_sr",
        "num_seq_splits", "cpu_offload", "pp_algorithm", "communication_method", "debug_scheduler_table",
        "offload", "offload_ops", "pp_max_mem", "pp_cost_f", "pp_cost_b", "pp_cost_w")),
    unsupported("decoder_pipeline_manual_split_list", "a manual split of layers over pipeline stages (Megatron "
                                                      "splits evenly here)"),
    custom("recompute_layer_ids", "AMD Primus's per-layer recomputation", _recompute_layer_ids),
    inert("dataloader_mp_context", "the Megatron data loader runs in the training process here"),
    # -- training features AMD Primus adds ------------------------------------------------------
    inert("moe_router_force_load_balancing_type", "forced load balancing is Megatron-LM's (uniform)"),
    unsupported("weight_deosc", "MXFP4 weight de-oscillation (changes the update)"),
    *(inert(key, "read only with weight_deosc") for key in (
        "weight_deosc_period", "weight_deosc_ratio", "weight_deosc_start_step", "weight_deosc_log_freq")),
    unsupported("enable_odc", "ODC on-demand communication needs rocSHMEM/MORI"),
    *(inert(key, "read only with enable_odc") for key in (
        "odc_phase", "odc_grad_spike_threshold", "odc_p2p_backend", "odc_mori_init", "odc_max_buffer_size",
        "odc_rocshmem_gda", "odc_rocshmem_lib", "odc_gda_rs_blocks", "odc_gda_pipe", "odc_gda_defer_reduce",
        "odc_gda_warmup_mode", "odc_gda_stride_bytes")),
    unsupported("data_parallel_replicate_degree", "HSDP (replicated FSDP groups) is not supported",
                off=(None, 1)),
    inert("standalone_embedding_stage", STALE),
    inert("use_custom_fsdp", STALE),
    inert("keep_fp8_transpose_cache_when_using_custom_fsdp", STALE),
    inert("retriever_seq_length", STALE),
    inert("legacy_tokenizer", STALE),
    unsupported("moe_extended_tp", "removed from Megatron-LM; use expert_tensor_parallel_size"),
    inert("encoder_tensor_model_parallel_size", STALE),
    inert("encoder_pipeline_model_parallel_size", STALE),
    inert("pipeline_model_parallel_split_rank", STALE),
    inert("async_tensor_model_parallel_allreduce", STALE),
    *(inert(key, STALE) for key in (
        "retro_project_dir", "retro_add_retriever", "retro_cyclic_train_iters", "retro_encoder_layers",
        "retro_encoder_hidden_dropout", "retro_encoder_attention_dropout", "retro_num_neighbors",
        "retro_num_retrieved_chunks", "retro_attention_gate", "retro_verify_neighbor_count",
        "inference_dynamic_batching_buffer_guaranteed_fraction", "inference_dynamic_batching_buffer_overflow_factor",
        "inference_dynamic_batching_max_requests_override", "inference_dynamic_batching_max_tokens_override",
        "grpo_default_temperature", "grpo_default_top_p", "langrl_inference_server_type",
        "langrl_inference_server_conversation_template", "rl_offload_kv_cache_during_training",
        "rl_remove_kv_cache_during_training", "rl_reset_cuda_graphs", "rl_calculate_intra_group_similarity",
        "log_batch_size_to_tensorboard", "log_learning_rate_to_tensorboard")),
    rename("fully_parallel_save", "ckpt_fully_parallel_save", "Megatron-LM's name for it"),
    rename("virtual_pipeline_model_parallel_size", "num_virtual_stages_per_pipeline_rank",
           "Megatron-LM's argument for virtual pipeline stages per rank"),
    custom("mock_dataset", "AMD Primus synthetic dataset class", _mock_dataset),
    custom("model_type", "AMD Primus model family switch", _model_type),
    custom("tokenizer_type", "tokenizer type", _tokenizer_type),
    # -- SFT (sft_trainer.yaml). hf_path, sft_dataset_name, sft_conversation_format and
    # enable_packed_sequences are read by the Megatron backend's post-training ------
    custom("sft_conversation_format", "SFT conversation format", _conversation_format),
    inert("sft_dataset_split", "the instruction JSONL files are read whole (a validation split is held out)"),
    inert("use_packed_attention", "packed sequences always get per-document attention masks here (AMD's true)"),
    inert("enable_odc_lb_mini", "AMD Primus ODC load balancing; off here"),
    inert("lb_mini_max_token_len", "read only with enable_odc_lb_mini"),
    inert("lb_mini_cost_model", "read only with enable_odc_lb_mini"),
    inert("enable_fused_linear_ce", "AMD Primus chunked cross-entropy (same math); the full-logits loss runs"),
    inert("sft_bridge_compat_inline_bos", "Megatron-Bridge byte-parity mode of AMD Primus's SFT data"),
    rename("sft_sanitize_nan_grads", "primus.sanitize_nan_grads", "NaN/Inf gradient elements become 0 before "
           "megatron-core's gradient check and reduction (AMD Primus's benchmark switch)", convert=switch),
    custom("lora", "LoRA adapters", _lora),
    # -- model keys of AMD Primus's own layers (primus_megatron_model.yaml) --------------------
    inert("disable_primus_topk_router", "megatron-core's top-k router runs here"),
    unsupported("use_deprecated_20241209_moe_layer", "AMD Primus's deprecated MoE layer", when="resolve"),
    unsupported("original_max_position_embeddings", "YaRN's original context is megatron-core's 4096 here "
                "(MLATransformerConfig; no Megatron-LM argument sets it)", off=(None, 4096)),
    unsupported("final_logit_softcapping", "logit soft-capping (Grok) is not in megatron-core 0.16"),
    unsupported("attn_logit_softcapping", "attention-logit soft-capping (Grok) is not in megatron-core 0.16"),
    unsupported("router_logit_softcapping", "router-logit soft-capping (Grok) is not in megatron-core 0.16"),
    # -- model families Primus's Megatron backend does not build --------------------------------
    *(_family(key, "DeepSeek-V4") for key in (
        "hc_mult", "hc_sinkhorn_iters", "hc_eps", "hc_use_sinkhorn", "mtp_use_separate_hc_head",
        "hybrid_attention_enabled", "index_head_dim", "index_n_heads", "attn_sliding_window", "attn_sink",
        "use_v4_attention_backend", "use_v4_csa_attention_backend", "use_v4_fp8_indexer",
        "v4_indexer_distill_loss_coeff", "use_v4_compiled_sinkhorn", "num_hash_layers", "swiglu_limit",
        "v4_grouped_experts_support_clamped_swiglu", "compress_rope_theta", "o_lora_rank", "o_groups",
        "index_topk", "compress_ratios")),
    *(_family(key, "Kimi-K3") for key in (
        "mla_use_nope", "mla_use_output_gate", "kda_gate_lower_bound", "kda_use_full_rank_gate", "kda_chunk_size",
        "kda_backend", "attn_res_block_size", "routed_expert_hidden_size", "latent_moe_use_norm",
        "moe_router_bias_update_rule", "quantile_balancing_num_bins", "quantile_balancing_margin_min",
        "quantile_balancing_margin_max", "quantile_balancing_center_bias", "quantile_balancing_update_interval",
        "quantile_balancing_ema_decay", "activation_situ_beta", "activation_situ_linear_beta",
        "num_nextn_predict_layers", "mtp_layer_type")),
    *(_family(key, "Mamba / hybrid") for key in (
        "mamba_expand", "mamba_d_conv", "hybrid_attention_ratio", "hybrid_mlp_ratio",
        "use_fla_fused_swiglu", "use_fla_fused_rmsnorm", "use_fla_fused_gated_norm", "use_fla_short_conv",
        "use_fla_data", "fla_cache_dir", "fused_ce_mode", "fused_ce_chunks", "fla_mla_attn", "use_short_conv")),
    *(_family(key, "LFM2") for key in ("lfm_layer_types", "conv_L_cache", "conv_bias")),
    _family("fused_padded_mla_attention", "Flux / diffusion"),
)
