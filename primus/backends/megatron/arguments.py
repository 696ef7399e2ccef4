"""Megatron backend configuration, spelled with Megatron-LM's own argument names.

Users coming from Megatron-LM (or AMD Primus YAMLs) write the flat keys they know
(``num_layers``, ``tensor_model_parallel_size``, ``lr_warmup_iters`` ...). ``MegatronArgs`` is
the whole accepted surface: an unknown key is an error with a did-you-mean, never ignored.

A ``model:`` block of neutral ``ModelSpec`` keys (the preset TorchTitan also reads) may
sit beside the flat keys; it is translated first and flat keys given explicitly override it.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from primus.config.errors import ConfigError, did_you_mean
from primus.plan.model import ModelSpec

# Keys describing the network: never part of defaults() or the module preset, so that a
# neutral `model:` block is not silently overridden by a default value.
MODEL_SHAPE_KEYS = frozenset({
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "group_query_attention",
    "num_query_groups", "kv_channels", "max_position_embeddings", "position_embedding_type",
    "rotary_base", "rotary_percent", "use_rope_scaling", "rope_scaling_factor", "normalization", "norm_epsilon", "swiglu",
    "untie_embeddings_and_output_weights", "vocab_size", "disable_bias_linear",
    "attention_dropout", "hidden_dropout", "embedding_init_method_std",
})


class MegatronArgs(BaseModel):
    """Megatron-LM arguments this backend understands (names and defaults as in Megatron-LM)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # Model shape.
    num_layers: int | None = Field(None, gt=0)
    hidden_size: int | None = Field(None, gt=0)
    ffn_hidden_size: int | None = Field(None, gt=0)
    num_attention_heads: int | None = Field(None, gt=0)
    group_query_attention: bool = False
    num_query_groups: int = Field(1, gt=0)
    kv_channels: int | None = Field(None, gt=0)
    seq_length: int | None = Field(None, gt=0)
    max_position_embeddings: int | None = Field(None, gt=0)
    position_embedding_type: Literal["learned_absolute", "rope", "none"] = "learned_absolute"
    rotary_base: float = 10000.0
    rotary_percent: float = 1.0
    use_rope_scaling: bool = False  # Llama 3.1 long-context RoPE frequency scaling
    rope_scaling_factor: float = 8.0
    normalization: Literal["LayerNorm", "RMSNorm"] = "LayerNorm"
    norm_epsilon: float = 1e-5
    swiglu: bool = False
    untie_embeddings_and_output_weights: bool = False
    disable_bias_linear: bool = False
    attention_dropout: float = Field(0.1, ge=0, le=1)
    hidden_dropout: float = Field(0.1, ge=0, le=1)
    vocab_size: int | None = Field(None, gt=0)
    make_vocab_size_divisible_by: int = Field(128, gt=0)
    tokenizer_type: Literal["HuggingFaceTokenizer", "NullTokenizer"] | None = None
    tokenizer_model: str | None = None
    transformer_impl: Literal["auto", "local", "transformer_engine"] = "auto"

    # Training.
    micro_batch_size: int = Field(1, gt=0)
    global_batch_size: int | None = Field(None, gt=0)
    train_iters: int | None = Field(None, gt=0)
    optimizer: Literal["adam", "sgd"] = "adam"
    lr: float | None = Field(None, ge=0)
    min_lr: float = Field(0.0, ge=0)
    lr_decay_style: Literal["constant", "linear", "cosine", "inverse-square-root", "WSD"] = "linear"
    lr_decay_iters: int | None = Field(None, gt=0)
    lr_warmup_iters: int = Field(0, ge=0)
    lr_warmup_init: float = Field(0.0, ge=0)
    weight_decay: float = Field(0.01, ge=0)
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    sgd_momentum: float = 0.9
    clip_grad: float = Field(1.0, ge=0)
    bf16: bool = False
    fp16: bool = False
    loss_scale: float | None = None
    initial_loss_scale: float = 2.0**32
    seed: int = 1234
    init_method_std: float = 0.02
    embedding_init_method_std: float | None = Field(None, gt=0)  # None: init_method_std (megatron-core)

    # Parallelism.
    tensor_model_parallel_size: int = Field(1, gt=0)
    pipeline_model_parallel_size: int = Field(1, gt=0)
    num_layers_per_virtual_pipeline_stage: int | None = Field(None, gt=0)
    sequence_parallel: bool = False
    use_distributed_optimizer: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    accumulate_allreduce_grads_in_fp32: bool = False

    # Activation recomputation.
    recompute_granularity: Literal["full", "selective"] | None = None
    recompute_method: Literal["uniform", "block"] | None = None
    recompute_num_layers: int | None = Field(None, gt=0)

    # Checkpointing (dist_checkpointing, torch_dist format).
    save: str | None = None
    load: str | None = None
    save_interval: int | None = Field(None, gt=0)
    finetune: bool = False
    no_load_optim: bool = False
    no_load_rng: bool = False
    no_save_optim: bool = False

    # Data.
    mock_data: bool = False
    data_path: list[str] | None = None
    split: str = "969,30,1"
    data_cache_path: str | None = None
    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    eod_mask_loss: bool = False

    # Logging / evaluation.
    log_interval: int = Field(100, gt=0)
    eval_interval: int | None = Field(1000, gt=0)
    eval_iters: int = Field(100, ge=0)

    # The neutral model block (ModelSpec keys); translated before validation.
    model: dict[str, Any] | None = None

    @property
    def virtual_pipeline_model_parallel_size(self) -> int | None:
        if self.num_layers_per_virtual_pipeline_stage is None:
            return None
        per_stage = self.num_layers // self.pipeline_model_parallel_size
        return per_stage // self.num_layers_per_virtual_pipeline_stage

    @property
    def query_groups(self) -> int:
        return self.num_query_groups if self.group_query_attention else self.num_attention_heads


def translate_neutral_model(model: dict[str, Any]) -> dict[str, Any]:
    """A ``model:`` block of ``ModelSpec`` keys -> Megatron-LM arguments for the same network."""
    spec = ModelSpec(**model)
    return {
        "num_layers": spec.n_layers,
        "hidden_size": spec.dim,
        "num_attention_heads": spec.n_heads,
        "group_query_attention": spec.kv_heads != spec.n_heads,
        "num_query_groups": spec.kv_heads,
        "ffn_hidden_size": spec.ffn_dim,
        "vocab_size": spec.vocab_size,
        "rotary_base": spec.rope_theta,
        "use_rope_scaling": spec.rope_scaling == "llama",
        "norm_epsilon": spec.norm_eps,
        "max_position_embeddings": spec.max_seq_len,
        "swiglu": True,
        "normalization": "RMSNorm",
        "position_embedding_type": "rope",
        "untie_embeddings_and_output_weights": not spec.tie_embeddings,
        "disable_bias_linear": True,  # Llama has no biases in its linear layers
        "attention_dropout": 0.0,  # nor dropout
        "hidden_dropout": 0.0,
        # Only when asked: None keeps megatron-core's default (init_method_std).
        **({"embedding_init_method_std": spec.embedding_init_std} if spec.embedding_init_std is not None else {}),
    }


def _where(provenance, dotted: str) -> str:
    describe = getattr(provenance, "describe", None)
    location = describe(dotted) if describe else None
    return f"{location}: " if location else ""


def parse_args(params: dict[str, Any], *, module: str = "pre_trainer", provenance=None) -> MegatronArgs:
    """Merge the neutral model block under the flat keys and validate; user errors -> ConfigError."""
    params = dict(params)
    merged: dict[str, Any] = {}
    if params.get("model") is not None:
        model = params["model"]
        try:
            merged.update(translate_neutral_model(model))
        except (ValidationError, TypeError) as exc:
            raise _config_error(exc, f"modules.{module}.model", ModelSpec.model_fields, provenance) from None
    merged.update(params)
    try:
        args = MegatronArgs(**merged)
    except ValidationError as exc:
        raise _config_error(exc, f"modules.{module}", MegatronArgs.model_fields, provenance) from None
    check_args(args, module=module, provenance=provenance)
    return args


def _config_error(exc: Exception, prefix: str, fields, provenance) -> ConfigError:
    if not isinstance(exc, ValidationError):
        return ConfigError(f"{_where(provenance, prefix)}{prefix}: {exc}")
    error = exc.errors()[0]
    key = ".".join(str(part) for part in error["loc"])
    dotted = f"{prefix}.{key}" if key else prefix
    where = _where(provenance, dotted)
    if error["type"] == "extra_forbidden":
        return ConfigError(f"{where}{dotted}: unknown Megatron argument{did_you_mean(key, fields)}")
    value = error.get("input")
    shown = f" (got {value!r})" if key and not isinstance(value, dict) else ""
    return ConfigError(f"{where}{dotted}: {error['msg']}{shown}")


def _require(args: MegatronArgs, keys: tuple[str, ...], module: str, provenance) -> None:
    for key in keys:
        if getattr(args, key) is None:
            dotted = f"modules.{module}.{key}"
            raise ConfigError(f"{_where(provenance, dotted)}{dotted} is required (set it or give a `model:` preset)")


def check_args(args: MegatronArgs, *, module: str = "pre_trainer", provenance=None) -> None:
    """Rules that need several keys together (those not needing the world size)."""
    _require(args, ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "train_iters", "lr"),
             module, provenance)
    if args.bf16 and args.fp16:
        raise ConfigError(f"modules.{module}: bf16 and fp16 are both true; choose one")
    if args.min_lr > args.lr:
        raise ConfigError(f"modules.{module}: min_lr ({args.min_lr}) is larger than lr ({args.lr})")
    if args.position_embedding_type == "learned_absolute" and args.max_position_embeddings \
            and args.seq_length > args.max_position_embeddings:
        raise ConfigError(f"modules.{module}: seq_length ({args.seq_length}) exceeds max_position_embeddings "
                          f"({args.max_position_embeddings}) with learned_absolute position embeddings")
    if not args.mock_data and not args.data_path:
        raise ConfigError(f"modules.{module}: set data_path (indexed .bin/.idx prefix) or mock_data: true")
    if args.data_path and args.tokenizer_type != "HuggingFaceTokenizer":
        raise ConfigError(f"modules.{module}.tokenizer_type: real data needs tokenizer_type: HuggingFaceTokenizer "
                          f"with tokenizer_model (got {args.tokenizer_type!r})")
    if args.tokenizer_type == "HuggingFaceTokenizer" and not args.tokenizer_model:
        raise ConfigError(f"modules.{module}.tokenizer_model: required with tokenizer_type: HuggingFaceTokenizer")
    if args.recompute_method is not None and args.recompute_granularity != "full":
        raise ConfigError(f"modules.{module}.recompute_method: only valid with recompute_granularity: full "
                          f"(got {args.recompute_granularity!r})")
    if args.recompute_granularity == "full" and (args.recompute_method is None or args.recompute_num_layers is None):
        raise ConfigError(f"modules.{module}: recompute_granularity: full needs recompute_method and recompute_num_layers")
    check_parallel_layout(args, world_size=None, module=module)


def check_parallel_layout(args: MegatronArgs, world_size: int | None, *, module: str = "pre_trainer") -> int | None:
    """Fail fast, one line per mistake, on layouts Megatron would assert on later.

    Returns the data-parallel size when ``world_size`` is known.
    """
    m = f"modules.{module}"
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    if args.num_attention_heads % tp:
        raise ConfigError(f"{m}: num_attention_heads ({args.num_attention_heads}) is not divisible by "
                          f"tensor_model_parallel_size ({tp})")
    if args.group_query_attention and args.num_attention_heads % args.num_query_groups:
        raise ConfigError(f"{m}: num_attention_heads ({args.num_attention_heads}) is not divisible by "
                          f"num_query_groups ({args.num_query_groups})")
    if args.query_groups % tp:
        raise ConfigError(f"{m}: num_query_groups ({args.query_groups}) is not divisible by "
                          f"tensor_model_parallel_size ({tp})")
    if args.hidden_size % args.num_attention_heads:
        raise ConfigError(f"{m}: hidden_size ({args.hidden_size}) is not divisible by "
                          f"num_attention_heads ({args.num_attention_heads})")
    if args.num_layers % pp:
        raise ConfigError(f"{m}: num_layers ({args.num_layers}) is not divisible by "
                          f"pipeline_model_parallel_size ({pp})")
    if args.num_layers_per_virtual_pipeline_stage is not None:
        if pp < 2:
            raise ConfigError(f"{m}: num_layers_per_virtual_pipeline_stage needs pipeline_model_parallel_size > 1 (got {pp})")
        per_stage = args.num_layers // pp
        if per_stage % args.num_layers_per_virtual_pipeline_stage:
            raise ConfigError(f"{m}: layers per pipeline stage ({args.num_layers} / {pp} = {per_stage}) is not divisible "
                              f"by num_layers_per_virtual_pipeline_stage ({args.num_layers_per_virtual_pipeline_stage})")
    if args.sequence_parallel and tp == 1:
        raise ConfigError(f"{m}: sequence_parallel needs tensor_model_parallel_size > 1")
    if args.global_batch_size is not None and args.global_batch_size % args.micro_batch_size:
        raise ConfigError(f"{m}: global_batch_size ({args.global_batch_size}) is not divisible by "
                          f"micro_batch_size ({args.micro_batch_size})")
    if world_size is None:
        return None
    if world_size % (tp * pp):
        raise ConfigError(f"{m}: world size ({world_size}) is not divisible by tensor_model_parallel_size x "
                          f"pipeline_model_parallel_size ({tp} x {pp} = {tp * pp})")
    dp = world_size // (tp * pp)
    if args.global_batch_size is not None and args.global_batch_size % (args.micro_batch_size * dp):
        raise ConfigError(f"{m}: global_batch_size ({args.global_batch_size}) is not divisible by micro_batch_size x "
                          f"data-parallel size ({args.micro_batch_size} x {dp} = {args.micro_batch_size * dp})")
    if args.num_layers_per_virtual_pipeline_stage is not None:
        microbatches = (args.global_batch_size or args.micro_batch_size * dp) // (args.micro_batch_size * dp)
        if microbatches % pp:
            raise ConfigError(f"{m}: the interleaved schedule needs the number of micro-batches ({microbatches}) "
                              f"to be divisible by pipeline_model_parallel_size ({pp})")
    return dp


def default_args() -> dict[str, Any]:
    """Megatron-LM training defaults as plain data (model shape keys excluded; see MODEL_SHAPE_KEYS)."""
    values = MegatronArgs.model_construct().model_dump()
    return {k: v for k, v in values.items() if k not in MODEL_SHAPE_KEYS and v is not None and k != "model"}
