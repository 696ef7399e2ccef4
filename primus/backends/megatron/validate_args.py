"""Megatron-LM's ``validate_args`` rules that matter here, reproduced on the parsed arguments.

Megatron-LM checks and completes its namespace after argparse (``megatron/training/arguments.py``
``validate_args``): deprecated arguments, exclusive options, defaults derived from other
arguments (``ffn_hidden_size``, ``kv_channels``, ``expert_tensor_parallel_size`` ...), settings
it turns off with a warning (``sequence_parallel`` without tensor parallelism). The same rules
run here, each a few lines, in Megatron-LM's order; a rule that would end Megatron-LM with an
``AssertionError`` is one ``ConfigError`` line naming the key. Everything a rule chose is kept
as a note and said once at run time.

``check_parallel_layout`` holds the rules that need the world size.
"""
from __future__ import annotations

import math

from primus.config.errors import ConfigError
from primus.plan.layout import parse_pipeline_layout


def _fail(module: str, message: str, key: str | None = None) -> ConfigError:
    return ConfigError(f"modules.{module}{'.' + key if key else ''}: {message}")


def apply_megatron_lm_rules(args, *, module: str = "pre_trainer") -> None:
    """Complete and check ``args`` in place as Megatron-LM's validate_args does (no world size)."""
    m = module
    for key, instead in (("batch_size", "micro_batch_size"), ("warmup", "lr_warmup_fraction"),
                         ("model_parallel_size", "tensor_model_parallel_size")):
        if getattr(args, key) is not None:
            raise _fail(m, f"no longer valid in Megatron-LM, use {instead} instead", key)
    if args.checkpoint_activations:
        raise _fail(m, "no longer valid in Megatron-LM, use recompute_activations or recompute_granularity",
                    "checkpoint_activations")
    if args.recompute_activations:
        args.recompute_granularity = "selective"
        args.note("recompute_granularity", "selective", "recompute_activations: true (Megatron-LM)")

    _data_rules(args, m)
    if args.micro_batch_size is None:
        raise _fail(m, "is required (Megatron-LM has no default)", "micro_batch_size")
    _schedule_rules(args, m)
    _model_rules(args, m)
    _precision_rules(args, m)
    _moe_rules(args, m)

    _pipeline_split_rules(args)

    if args.tensor_model_parallel_size == 1 and args.sequence_parallel:
        args.sequence_parallel = False
        args.note("sequence_parallel", False, "tensor_model_parallel_size is 1: Megatron-LM disables sequence "
                  "parallelism without tensor parallelism", level="warning")
    if args.tp_comm_overlap and not args.sequence_parallel:
        raise _fail(m, "tensor-parallel communication overlap needs sequence_parallel: true", "tp_comm_overlap")
    if args.overlap_param_gather and not ((args.use_distributed_optimizer or args.use_megatron_fsdp)
                                          and args.overlap_grad_reduce):
        raise _fail(m, "needs use_distributed_optimizer (or use_megatron_fsdp): true and overlap_grad_reduce: true "
                    "(Megatron-LM)", "overlap_param_gather")
    _fsdp_rules(args, m)
    if args.recompute_granularity == "selective" and args.recompute_method is not None:
        raise _fail(m, "recompute_method is not supported with recompute_granularity: selective", "recompute_method")
    if args.recompute_method is not None and args.recompute_granularity != "full":
        raise _fail(m, f"only valid with recompute_granularity: full (got {args.recompute_granularity!r})",
                    "recompute_method")
    if args.recompute_granularity == "full" and (args.recompute_method is None or args.recompute_num_layers is None):
        raise _fail(m, "recompute_granularity: full needs recompute_method and recompute_num_layers")
    if args.recompute_method == "uniform" and args.recompute_num_layers == 0:
        # megatron-core's uniform loop advances by recompute_num_layers: with 0 it never ends
        raise _fail(m, "must be at least 1 with recompute_method: uniform (layers per recomputed chunk; "
                       "block takes 0: no layer recomputed)", "recompute_num_layers")
    if args.distribute_saved_activations and (args.tensor_model_parallel_size == 1
                                              or args.recompute_granularity != "full"):
        raise _fail(m, "needs tensor_model_parallel_size > 1 and recompute_granularity: full",
                    "distribute_saved_activations")
    if args.save is not None and args.save_interval is None:
        raise _fail(m, "save is set: Megatron-LM needs save_interval too", "save_interval")
    if args.log_memory_interval is not None and args.log_memory_interval % args.log_interval:
        raise _fail(m, f"must be a multiple of log_interval ({args.log_interval})", "log_memory_interval")


def _fsdp_rules(args, m: str) -> None:
    """Megatron-LM's asserts for PyTorch FSDP2 and Megatron-FSDP and the checkpoint formats they save."""
    if args.use_torch_fsdp2:
        for broken, key, message in (
            (args.pipeline_model_parallel_size != 1, "pipeline_model_parallel_size", "is not supported with pipeline parallelism"),
            (args.expert_model_parallel_size != 1, "expert_model_parallel_size", "is not supported with expert parallelism"),
            (args.use_distributed_optimizer, "use_distributed_optimizer", "is not supported with MCore's distributed optimizer"),
            (args.gradient_accumulation_fusion, "gradient_accumulation_fusion", "is not supported with gradient "
             "accumulation fusion (set gradient_accumulation_fusion: false)"),
            (args.ckpt_format not in ("torch_dist", "torch_dcp"), "ckpt_format", "requires ckpt_format torch_dist or torch_dcp"),
            (not args.untie_embeddings_and_output_weights, "untie_embeddings_and_output_weights",
             "requires untie_embeddings_and_output_weights: true"),
            (args.fp16, "fp16", "is not supported with fp16 yet"),
        ):
            if broken:
                raise _fail(m, f"use_torch_fsdp2 {message} (Megatron-LM)", key)
    if args.use_megatron_fsdp and args.ckpt_format != "fsdp_dtensor":
        raise _fail(m, "Megatron FSDP only supports the fsdp_dtensor checkpoint format (Megatron-LM); "
                    "set ckpt_format: fsdp_dtensor", "ckpt_format")
    if args.ckpt_format == "fsdp_dtensor" and not args.use_megatron_fsdp:
        raise _fail(m, "fsdp_dtensor is only tested with Megatron FSDP (Megatron-LM); set use_megatron_fsdp: true "
                    "or another ckpt_format", "ckpt_format")


def _data_rules(args, m: str) -> None:
    if args.data_path is not None and args.split is None:
        args.split = "969, 30, 1"
        args.note("split", args.split, "data_path without split: Megatron-LM's legacy default", level="warning")
    if args.data_path and args.data_args_path:
        raise _fail(m, "data_path and data_args_path are exclusive")
    per_split = [args.train_data_path, args.valid_data_path, args.test_data_path]
    if any(p is not None for p in per_split) and args.per_split_data_args_path is not None:
        raise _fail(m, "train/valid/test_data_path and per_split_data_args_path are exclusive")
    sources = data_sources(args)
    if sources > 1:
        raise _fail(m, "give one data source: mock_data, data_path, or train_data_path/valid_data_path/"
                       "test_data_path (Megatron-LM)")
    # none at all is Megatron-LM's "<= 1" too: planning a model needs no data; a launch does (require_data_source)
    if sources and not args.mock_data and args.tokenizer_type is None:
        raise _fail(m, "real data needs tokenizer_type (HuggingFaceTokenizer with tokenizer_model, GPT2BPETokenizer "
                       "with vocab_file and merge_file, Llama2Tokenizer / SentencePieceTokenizer / TikTokenizer with "
                       "tokenizer_model)", "tokenizer_type")
    from primus.backends.megatron.tokenizers import required_keys

    for key in required_keys(args.tokenizer_type):
        if not getattr(args, key):
            raise _fail(m, f"required with tokenizer_type: {args.tokenizer_type}", key)
    if args.dataloader_type is None:
        args.dataloader_type = "single"
    if args.seq_length is None and args.encoder_seq_length is not None:
        args.seq_length = args.encoder_seq_length
    elif args.seq_length is not None and args.encoder_seq_length is not None:
        raise _fail(m, "seq_length and encoder_seq_length are the same argument: give one", "encoder_seq_length")


def data_sources(args) -> int:
    """How many of Megatron-LM's data sources the arguments give (mock, data_path, per-split paths)."""
    per_split = (args.train_data_path, args.valid_data_path, args.test_data_path)
    return int(bool(args.mock_data)) + int(bool(args.data_path)) + int(any(per_split))


def require_data_source(args, module: str = "pre_trainer") -> None:
    """A launch reads data: Megatron-LM's dataset builder needs one source (validate_args accepts none)."""
    if not data_sources(args):
        raise _fail(module, "set data_path (indexed .bin/.idx prefixes), train_data_path/valid_data_path/"
                            "test_data_path, or mock_data: true (a run reads data; plan and validate need none)")

def _iterations_or_samples(args, m: str) -> None:
    """Megatron-LM's iteration- vs sample-based training (validate_args and update_train_iters, d3528a2): one
    or the other; sample-based training runs train_samples // global_batch_size iterations, its LR schedule
    counted in samples (lr_decay_samples, lr_warmup_samples, lr_wsd_decay_samples)."""
    if args.train_iters:
        for key, off, what in (("train_samples", None, "iteration-based training"),
                               ("lr_decay_samples", None, "iteration-based learning rate decay"),
                               ("lr_warmup_samples", 0, "iteration-based learning rate warmup"),
                               ("rampup_batch_size", None, "no batch-size rampup for iteration-based training")):
            if getattr(args, key) != off:
                raise _fail(m, f"Megatron-LM expects {what} with train_iters (give train_samples instead of "
                               "train_iters, or drop it)", key)
    if not args.train_samples:
        return
    for key, off, what in (("lr_decay_iters", None, "sample-based learning rate decay"),
                           ("lr_warmup_iters", 0, "sample-based learning rate warmup")):
        if getattr(args, key) != off:
            raise _fail(m, f"Megatron-LM expects {what} with train_samples", key)
    if args.lr_warmup_fraction is not None and args.lr_warmup_samples:
        raise _fail(m, "give one of lr_warmup_fraction and lr_warmup_samples (Megatron-LM)", "lr_warmup_samples")
    if args.global_batch_size is None:
        raise _fail(m, "train_samples needs global_batch_size here (the run is train_samples / global_batch_size "
                       "iterations)", "global_batch_size")
    if args.rampup_batch_size is None:
        args.train_iters = args.train_samples // args.global_batch_size
        args.note("train_iters", args.train_iters, "train_samples / global_batch_size (Megatron-LM's update_train_iters)")


def _schedule_rules(args, m: str) -> None:
    _iterations_or_samples(args, m)
    if args.train_iters and args.lr_warmup_fraction is not None and args.lr_warmup_iters:
        raise _fail(m, "give one of lr_warmup_fraction and lr_warmup_iters (Megatron-LM)")
    if args.lr is not None and args.min_lr > args.lr:
        raise _fail(m, f"min_lr ({args.min_lr}) is larger than lr ({args.lr})")
    if args.weight_decay_incr_style == "constant":
        if args.start_weight_decay is not None or args.end_weight_decay is not None:
            raise _fail(m, "start_weight_decay/end_weight_decay need weight_decay_incr_style linear or cosine")
        args.start_weight_decay = args.end_weight_decay = args.weight_decay
    elif args.start_weight_decay is None or args.end_weight_decay is None:
        raise _fail(m, f"weight_decay_incr_style: {args.weight_decay_incr_style} needs start_weight_decay "
                       "and end_weight_decay")
    if args.lr_decay_style == "WSD" and args.lr_wsd_decay_iters is None and args.lr_wsd_decay_samples is None:
        raise _fail(m, "lr_decay_style: WSD needs lr_wsd_decay_iters (Megatron-LM's scheduler)", "lr_wsd_decay_iters")
    if args.train_iters and not args.train_samples:
        clamp_warmup(args)


def clamp_warmup(args) -> None:
    """A warm-up at least as long as the decay (AMD's blog experiment: 50 iterations, a preset's 200
    warm-up) makes megatron-core's scheduler assert ``lr_warmup_steps < lr_decay_steps``. Clamp it
    to one iteration less than the decay, said in a warning, rather than end in a bare AssertionError."""
    decay = args.lr_decay_iters or args.train_iters
    warmup = int(args.lr_warmup_fraction * decay) if args.lr_warmup_fraction is not None else args.lr_warmup_iters
    if warmup < decay:
        return
    if decay < 2:
        args.lr_warmup_iters, args.lr_warmup_fraction = 0, None
    else:
        args.lr_warmup_iters, args.lr_warmup_fraction = decay - 1, None
    args.note("lr_warmup_iters", args.lr_warmup_iters,
              f"the warm-up ({warmup} iterations) is not shorter than the LR decay ({decay} iterations); "
              "clamped to decay - 1 as Megatron's scheduler needs", level="warning")


def _position_embedding_rules(args, m: str) -> None:
    if not args.add_position_embedding and args.position_embedding_type != "rope":  # Megatron-LM, d3528a2
        raise _fail(m, "no_position_embedding is deprecated in Megatron-LM (allowed with position_embedding_type: "
                       "rope only): use position_embedding_type", "add_position_embedding")


def _model_rules(args, m: str) -> None:
    _position_embedding_rules(args, m)
    if args.num_layers is None and args.encoder_num_layers is not None:
        args.num_layers = args.encoder_num_layers
    elif args.num_layers is not None and args.encoder_num_layers is not None:
        raise _fail(m, "num_layers and encoder_num_layers are the same argument: give one", "encoder_num_layers")
    for key in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "train_iters", "lr"):
        if getattr(args, key) is None:
            raise _fail(m, "is required (set it or give a `model:` preset)", key)
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length
        args.note("max_position_embeddings", args.seq_length, "not set: seq_length (Megatron-LM requires it)")
    if args.max_position_embeddings < args.seq_length:
        raise _fail(m, f"max_position_embeddings ({args.max_position_embeddings}) must be at least seq_length "
                       f"({args.seq_length}) (Megatron-LM)")
    if args.ffn_hidden_size is None:
        args.ffn_hidden_size = (int((4 * args.hidden_size * 2 / 3) / 64) * 64 if args.swiglu
                                else 4 * args.hidden_size)
        args.note("ffn_hidden_size", args.ffn_hidden_size, "not set: Megatron-LM's default from hidden_size")
    if args.kv_channels is None:
        if args.hidden_size % args.num_attention_heads:
            raise _fail(m, f"hidden_size ({args.hidden_size}) is not divisible by num_attention_heads "
                           f"({args.num_attention_heads}); set kv_channels")
        args.kv_channels = args.hidden_size // args.num_attention_heads
    if args.group_query_attention and args.num_attention_heads % args.num_query_groups:
        raise _fail(m, f"num_attention_heads ({args.num_attention_heads}) is not divisible by num_query_groups "
                       f"({args.num_query_groups})")
    if args.use_rotary_position_embeddings:
        args.position_embedding_type = "rope"
    if args.position_embedding_type != "rope":
        args.apply_rope_fusion = False
    if args.position_embedding_type == "mrope" and args.mrope_section is None:
        raise _fail(m, "position_embedding_type: mrope needs mrope_section", "mrope_section")
    if not args.add_bias_linear:
        args.bias_gelu_fusion = False
    else:
        args.add_qkv_bias = True  # Megatron-LM keeps the two in sync
    if args.apply_query_key_layer_scaling:
        args.attention_softmax_in_fp32 = True
    if args.squared_relu and args.swiglu or args.quick_geglu and args.swiglu:
        raise _fail(m, "swiglu excludes squared_relu and quick_geglu")
    if args.multi_latent_attention and args.kv_lora_rank is None:
        raise _fail(m, "multi_latent_attention needs kv_lora_rank", "kv_lora_rank")


def _precision_aware_optimizer_rules(args, m: str) -> None:
    """megatron-core's OptimizerConfig asserts these (optimizer_config.py, 0.16.1): said before launch."""
    if args.use_precision_aware_optimizer:
        if args.optimizer != "adam":
            raise _fail(m, "use_precision_aware_optimizer needs optimizer: adam (megatron-core)", "optimizer")
        if not args.use_distributed_optimizer:
            raise _fail(m, "use_precision_aware_optimizer needs use_distributed_optimizer: true (megatron-core)",
                        "use_distributed_optimizer")
        return
    for key in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        if getattr(args, key) != "fp32":
            raise _fail(m, f"{getattr(args, key)} needs use_precision_aware_optimizer: true (megatron-core keeps "
                           "fp32 otherwise)", key)


def _precision_rules(args, m: str) -> None:
    if args.bf16 and args.fp16:
        raise _fail(m, "bf16 and fp16 are both true; choose one")
    if args.fp16 and not args.loss_scale and args.check_for_nan_in_loss_and_grad:
        args.check_for_nan_in_loss_and_grad = False
        args.note("check_for_nan_in_loss_and_grad", False, "fp16 with dynamic loss scaling: NaNs are the loss "
                  "scaler's signal (Megatron-LM)", level="warning")
    if args.bf16:
        if args.grad_reduce_in_bf16:
            args.accumulate_allreduce_grads_in_fp32 = False
        elif not args.accumulate_allreduce_grads_in_fp32 and args.main_grads_dtype == "fp32":
            args.accumulate_allreduce_grads_in_fp32 = True
            args.note("accumulate_allreduce_grads_in_fp32", True, "bf16: Megatron-LM accumulates and all-reduces "
                      "gradients in fp32")
    _precision_aware_optimizer_rules(args, m)
    if args.fp16_lm_cross_entropy and not args.fp16:
        raise _fail(m, "needs fp16: true", "fp16_lm_cross_entropy")
    if args.fp32_residual_connection and not (args.fp16 or args.bf16):
        raise _fail(m, "needs fp16 or bf16", "fp32_residual_connection")


def layer_pattern(value, num_layers: int, key: str, m: str):
    """Megatron-LM's ``moe_freq_type``: an int, a list, or a pattern string such as "([0]*3+[1]*58)"
    that Megatron-LM evaluates; here only list literals, integers, ``+`` and ``*`` are read."""
    if not isinstance(value, str):
        return value
    import ast

    def evaluate(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.List):
            return [evaluate(item) for item in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = evaluate(node.left), evaluate(node.right)
            if isinstance(node.op, ast.Mult) and max(abs(left) if isinstance(left, int) else 1,
                                                     abs(right) if isinstance(right, int) else 1) > 100_000:
                raise ValueError(value)  # a layer pattern, not a memory bomb
            return left + right if isinstance(node.op, ast.Add) else left * right
        raise ValueError(value)

    try:
        pattern = evaluate(ast.parse(value.strip(), mode="eval").body)
    except (SyntaxError, ValueError, TypeError, MemoryError):
        pattern = None
    if not (isinstance(pattern, int) or isinstance(pattern, list) and all(v in (0, 1) for v in pattern)):
        raise _fail(m, f"cannot read the layer pattern {value!r} (an int, or a 0/1 list such as "
                       f"\"[1]*{num_layers}\")", key)
    return pattern


def _moe_rules(args, m: str) -> None:
    args.moe_layer_freq = layer_pattern(args.moe_layer_freq, args.num_layers, "moe_layer_freq", m)
    if args.num_experts == 0:
        args.num_experts = None
    if args.num_experts is not None and args.moe_ffn_hidden_size is None:
        args.moe_ffn_hidden_size = args.ffn_hidden_size
        args.note("moe_ffn_hidden_size", args.ffn_hidden_size, "not set: ffn_hidden_size (Megatron-LM)")
    if args.expert_model_parallel_size > 1:
        if args.num_experts is None:
            raise _fail(m, "expert_model_parallel_size > 1 needs num_experts (a MoE model)",
                        "expert_model_parallel_size")
        if args.num_experts % args.expert_model_parallel_size:
            raise _fail(m, f"num_experts ({args.num_experts}) is not a multiple of expert_model_parallel_size "
                           f"({args.expert_model_parallel_size})")
    if args.expert_tensor_parallel_size is None:
        args.expert_tensor_parallel_size = args.tensor_model_parallel_size
    if args.num_experts is not None and args.tensor_model_parallel_size > 1 and not args.sequence_parallel:
        raise _fail(m, "MoE with tensor_model_parallel_size > 1 needs sequence_parallel: true (megatron-core's "
                       "TransformerConfig refuses it otherwise)", "sequence_parallel")
    for key in ("moe_router_load_balancing_type", "moe_aux_loss_coeff"):
        value = getattr(args, key)
        if isinstance(value, list) and len(value) == 1:
            setattr(args, key, value[0])
    if args.num_experts is not None and isinstance(args.moe_layer_freq, list) \
            and len(args.moe_layer_freq) != args.num_layers:
        raise _fail(m, f"has {len(args.moe_layer_freq)} entries for {args.num_layers} layers", "moe_layer_freq")


def balanced_pipeline_layout(num_layers: int, pp: int, mtp_layers: int = 0) -> str:
    """A ``pipeline_model_parallel_layout`` for ``num_layers`` over ``pp`` stages when they do not divide:
    the embedding and the loss count as one layer each (Megatron-LM's account_for_*_in_pipeline_split),
    stages differ by at most one layer, the middle stages take the extra ones, MTP goes last."""
    units = num_layers + 2
    sizes = [units // pp] * pp
    for i in [*range(1, pp - 1), pp - 1, 0][: units % pp]:
        sizes[i] += 1
    stages = [f"t*{n}" for n in sizes]
    stages[0] = f"Et*{sizes[0] - 1}"
    stages[-1] = f"t*{sizes[-1] - 1}" + ",m" * mtp_layers + ",L"
    return "|".join(stages)


def _pipeline_split_rules(args) -> None:
    """Files Megatron-LM refuses only for how the layers split over pipeline stages, AMD's own among
    them (Llama 3.1 405B: 126 layers on PP 8; DeepSeek-V3 layouts that leave out its MTP layer), get the
    split Megatron-LM's own options would give, said in a warning naming what was derived."""
    pp, layout = args.pipeline_model_parallel_size, args.pipeline_model_parallel_layout
    mtp = args.mtp_num_layers or 0
    if layout is not None:
        try:
            stages = parse_pipeline_layout(layout, (args.num_layers or 0) + mtp)
        except ConfigError:
            return  # check_parallel_layout names the mistake
        if mtp and "m" not in "".join(stages) and stages and stages[-1].endswith("L"):
            args.pipeline_model_parallel_layout = layout.rstrip().removesuffix("L").rstrip(",") + ",m" * mtp + ",L"
            args.note("pipeline_model_parallel_layout", args.pipeline_model_parallel_layout,
                      f"the layout places no MTP layer and mtp_num_layers is {mtp}: the MTP layer goes on the last "
                      "stage, where Megatron-LM puts it without a layout", level="warning")
        return
    split_given = any(getattr(args, k) is not None for k in (
        "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
        "num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank")) or \
        args.account_for_embedding_in_pipeline_split or args.account_for_loss_in_pipeline_split
    if pp < 2 or split_given or not args.num_layers or args.num_layers % pp == 0 or args.num_layers + 2 < 2 * pp:
        return
    args.pipeline_model_parallel_layout = balanced_pipeline_layout(args.num_layers, pp, mtp)
    args.note("pipeline_model_parallel_layout", args.pipeline_model_parallel_layout,
              f"num_layers ({args.num_layers}) is not divisible by pipeline_model_parallel_size ({pp}), which "
              "Megatron-LM refuses; this split counts the embedding and the loss as a layer each (its "
              "account_for_*_in_pipeline_split) and evens out the rest", level="warning")


def virtual_pipeline_size(args) -> int | None:
    """Megatron-LM's virtual_pipeline_model_parallel_size (None: no interleaving)."""
    if args.pipeline_model_parallel_layout is not None:
        stages = parse_pipeline_layout(args.pipeline_model_parallel_layout,
                                       (args.num_layers or 0) + (args.mtp_num_layers or 0))
        vpp = len(stages) // args.pipeline_model_parallel_size
    elif args.num_virtual_stages_per_pipeline_rank is not None:
        vpp = args.num_virtual_stages_per_pipeline_rank
    elif args.num_layers_per_virtual_pipeline_stage is not None:
        vpp = args.num_layers // args.pipeline_model_parallel_size // args.num_layers_per_virtual_pipeline_stage
    else:
        return None
    return vpp if vpp > 1 else None


def _check_pipeline_layout(args, pp: int, m: str) -> None:
    """Megatron-LM's validate_args and megatron-core's TransformerConfig / PipelineParallelLayerLayout
    rules for ``pipeline_model_parallel_layout``."""
    key = f"{m}.pipeline_model_parallel_layout"
    others = [k for k in ("num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank")
              if getattr(args, k) is not None]
    if others:
        raise ConfigError(f"{key}: excludes {others[0]} (Megatron-LM takes one of the two)")
    others = [k for k in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers")
              if getattr(args, k) is not None] + \
             [k for k in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")
              if getattr(args, k)]
    if others:
        raise ConfigError(f"{key}: excludes {others[0]} (megatron-core: the layout places every layer)")
    try:
        stages = parse_pipeline_layout(args.pipeline_model_parallel_layout,
                                       (args.num_layers or 0) + (args.mtp_num_layers or 0))
    except ConfigError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    if len(stages) % pp:
        raise ConfigError(f"{key}: {len(stages)} stages are not divisible by pipeline_model_parallel_size ({pp})")
    flat = "".join(stages)  # layer order: stage i is virtual stage i // pp of rank i % pp
    if not flat.startswith("E") or not flat.endswith("L") or flat.count("E") != 1 or flat.count("L") != 1:
        raise ConfigError(f"{key}: must start with the embedding (E) and end with the loss (L), once each")
    if flat.count("t") != args.num_layers:
        raise ConfigError(f"{key}: places {flat.count('t')} decoder layers (t); num_layers is {args.num_layers}")
    if flat.count("m") != (args.mtp_num_layers or 0):
        raise ConfigError(f"{key}: places {flat.count('m')} MTP layers (m); mtp_num_layers is {args.mtp_num_layers}")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        raise ConfigError(f"{key}: decoder layers (t) must come before the MTP layers (m)")


def check_parallel_layout(args, world_size: int | None, *, module: str = "pre_trainer") -> int | None:
    """Fail fast, one line per mistake, on layouts Megatron would assert on later.

    Returns the data-parallel size when ``world_size`` is known.
    """
    m = f"modules.{module}"
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    ep, etp = args.expert_model_parallel_size, args.expert_tensor_parallel_size or tp
    if args.num_attention_heads % tp:
        raise ConfigError(f"{m}: num_attention_heads ({args.num_attention_heads}) is not divisible by "
                          f"tensor_model_parallel_size ({tp})")
    if args.query_groups % tp:
        raise ConfigError(f"{m}: num_query_groups ({args.query_groups}) is not divisible by "
                          f"tensor_model_parallel_size ({tp})")
    if args.hidden_size % args.num_attention_heads and args.kv_channels is None:
        raise ConfigError(f"{m}: hidden_size ({args.hidden_size}) is not divisible by "
                          f"num_attention_heads ({args.num_attention_heads})")
    layers = args.num_layers + int(args.account_for_embedding_in_pipeline_split) \
        + int(args.account_for_loss_in_pipeline_split)
    uneven = args.decoder_first_pipeline_num_layers is not None or args.decoder_last_pipeline_num_layers is not None
    if args.pipeline_model_parallel_layout is not None:
        _check_pipeline_layout(args, pp, m)  # the layout says the layers per stage: no even split needed
    elif layers % pp and not uneven:
        raise ConfigError(f"{m}: num_layers ({args.num_layers}) is not divisible by "
                          f"pipeline_model_parallel_size ({pp})")
    if args.num_layers_per_virtual_pipeline_stage is not None:
        if pp < 2:
            raise ConfigError(f"{m}: num_layers_per_virtual_pipeline_stage needs pipeline_model_parallel_size > 1 (got {pp})")
        per_stage = args.num_layers // pp
        if per_stage % args.num_layers_per_virtual_pipeline_stage:
            raise ConfigError(f"{m}: layers per pipeline stage ({args.num_layers} / {pp} = {per_stage}) is not divisible "
                              f"by num_layers_per_virtual_pipeline_stage ({args.num_layers_per_virtual_pipeline_stage})")
    if args.global_batch_size is not None and args.global_batch_size % args.micro_batch_size:
        raise ConfigError(f"{m}: global_batch_size ({args.global_batch_size}) is not divisible by "
                          f"micro_batch_size ({args.micro_batch_size})")
    if args.num_experts is not None and args.moe_ffn_hidden_size and args.moe_ffn_hidden_size % etp:
        raise ConfigError(f"{m}: moe_ffn_hidden_size ({args.moe_ffn_hidden_size}) is not divisible by "
                          f"expert_tensor_parallel_size ({etp})")
    cp = args.context_parallel_size
    if cp > 1 and args.seq_length is not None and args.seq_length % (2 * cp):
        raise ConfigError(f"{m}: seq_length ({args.seq_length}) is not a multiple of 2 x context_parallel_size "
                          f"({2 * cp}): each context-parallel rank takes two chunks (Megatron-LM's rule)")
    if cp > 1 and args.hierarchical_context_parallel_sizes and \
            math.prod(args.hierarchical_context_parallel_sizes) != cp:
        raise ConfigError(f"{m}: hierarchical_context_parallel_sizes {args.hierarchical_context_parallel_sizes} "
                          f"does not multiply to context_parallel_size ({cp})")
    if world_size is None:
        return None
    if world_size % (tp * pp * cp):
        names, sizes = "tensor_model_parallel_size x pipeline_model_parallel_size", f"{tp} x {pp}"
        if cp > 1:
            names, sizes = names + " x context_parallel_size", sizes + f" x {cp}"
        raise ConfigError(f"{m}: world size ({world_size}) is not divisible by {names} ({sizes} = {tp * pp * cp})")
    dp = world_size // (tp * pp * cp)  # Megatron-LM's data_parallel_size: context-parallel ranks are not data-parallel
    if world_size % (etp * ep * pp):
        raise ConfigError(f"{m}: world size ({world_size}) is not divisible by expert_tensor_parallel_size x "
                          f"expert_model_parallel_size x pipeline_model_parallel_size ({etp} x {ep} x {pp})")
    if args.global_batch_size is not None and args.global_batch_size % (args.micro_batch_size * dp):
        raise ConfigError(f"{m}: global_batch_size ({args.global_batch_size}) is not divisible by micro_batch_size x "
                          f"data-parallel size ({args.micro_batch_size} x {dp} = {args.micro_batch_size * dp})")
    vpp = virtual_pipeline_size(args)
    if vpp is not None:
        microbatches = (args.global_batch_size or args.micro_batch_size * dp) // (args.micro_batch_size * dp)
        if microbatches % pp:
            raise ConfigError(f"{m}: the interleaved schedule needs the number of micro-batches ({microbatches}) "
                              f"to be divisible by pipeline_model_parallel_size ({pp})")
    return dp
