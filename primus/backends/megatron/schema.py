"""The Megatron schema: one pydantic field per row of Megatron-LM's generated argument table.

Types, choices, ``nargs`` lists and nulls are Megatron-LM's own (``megatron_lm_args.py``); what
argparse cannot say is added here: a range for every numeric argument (sizes and degrees > 0,
counts >= 0, probabilities in [0, 1], every float finite). Nothing here imports megatron-core,
so ``primus config validate --no-engine`` checks every key.

Megatron-LM names an argument by its argparse ``dest`` (``--disable-bias-linear`` sets
``add_bias_linear: false``); experiment files written for its command line may also spell the
option (``disable_bias_linear: true``, ``norm_epsilon``): ``option_aliases()`` maps those
spellings to the dest with the value argparse would store.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, Strict, create_model

from primus.backends.megatron import megatron_lm_args

FLAG_ACTIONS = {"store_true", "store_false", "boolean_optional"}


@dataclass(frozen=True)
class MegatronArg:
    """One Megatron-LM argument (a row of the generated table)."""

    dest: str
    options: tuple[str, ...]
    type: str | None
    default: Any
    choices: tuple | None
    nargs: Any
    action: str
    group: str

    @property
    def is_flag(self) -> bool:
        return self.action in FLAG_ACTIONS

    @property
    def is_list(self) -> bool:
        return self.nargs in ("+", "*") or isinstance(self.nargs, int)


@cache
def megatron_lm_table() -> dict[str, MegatronArg]:
    """dest -> MegatronArg, in Megatron-LM's parser order."""
    return {row[0]: MegatronArg(*row) for row in megatron_lm_args.ROWS}


# ---------------------------------------------------------------- ranges

# (lower, lower_inclusive, upper, upper_inclusive); None: unbounded on that side.
Range = tuple[float | None, bool, float | None, bool]
POSITIVE: Range = (0, False, None, False)
NON_NEGATIVE: Range = (0, True, None, False)
UNIT: Range = (0, True, 1, True)
ANY: Range = (None, False, None, False)

# Integer arguments where 0 is meaningful although the name reads like a size or a count.
_INT_ZERO_ALLOWED = {
    "eval_iters",  # 0: no evaluation
    "mtp_num_layers",  # 0: no multi-token prediction, as None
    "num_workers",  # 0: load in the main process
    "cpu_offloading_num_layers", "moe_shared_expert_intermediate_size",
    "num_experts",  # 0: dense (Megatron-LM turns it into None)
    # 0 with recompute_method: block recomputes no layer (megatron-core's block loop); Megatron-LM's
    # argparse takes any int (validate_args refuses uniform with 0: that loop would never advance)
    "recompute_num_layers",
}
# Integer arguments with a sentinel below zero (-1 = off / automatic), as Megatron-LM documents.
_INT_SENTINELS = {"rl_default_top_k": -1, "inference_batch_times_seqlen_threshold": -1,
                  "inference_dynamic_batching_num_cuda_graphs": -1, "logging_level": 0}
# Integer arguments that are sizes, counts of things that must exist, or degrees: > 0.
_INT_POSITIVE = re.compile(
    r"(_size|_sizes|_dim|_channels|_length|_heads|_groups|_topk|_rank|_divisible_by|_len|_interval|"
    r"_iters|_samples|_stage|_buckets|_count|_factor|_experts|_layers|_embeddings|_granularity)$|^num_|^seq_length$|"
    r"^rotary_base$")
_FLOAT_RANGES: dict[str, Range] = {
    "lr": NON_NEGATIVE, "min_lr": NON_NEGATIVE, "lr_warmup_init": NON_NEGATIVE, "decoupled_lr": NON_NEGATIVE,
    "decoupled_min_lr": NON_NEGATIVE, "weight_decay": NON_NEGATIVE, "start_weight_decay": NON_NEGATIVE,
    "end_weight_decay": NON_NEGATIVE, "clip_grad": NON_NEGATIVE,
    "adam_beta1": (0, True, 1, False), "adam_beta2": (0, True, 1, False), "sgd_momentum": UNIT,
    "muon_momentum": UNIT, "adam_eps": POSITIVE, "layernorm_epsilon": POSITIVE,
    "init_method_std": NON_NEGATIVE, "embedding_init_method_std": POSITIVE,
    "loss_scale": POSITIVE, "initial_loss_scale": POSITIVE, "min_loss_scale": POSITIVE, "loss_scale_window": POSITIVE,
    "rotary_base": POSITIVE, "rotary_percent": (0, False, 1, True), "rope_scaling_factor": POSITIVE,
    "rotary_scaling_factor": POSITIVE, "mscale": POSITIVE, "mscale_all_dim": NON_NEGATIVE,
    "moe_aux_loss_coeff": NON_NEGATIVE, "moe_z_loss_coeff": NON_NEGATIVE, "moe_router_topk_scaling_factor": POSITIVE,
    "moe_router_bias_update_rate": NON_NEGATIVE, "moe_expert_capacity_factor": POSITIVE,
    "moe_input_jitter_eps": NON_NEGATIVE, "mtp_loss_scaling_factor": NON_NEGATIVE,
    "lr_warmup_fraction": UNIT, "optimizer_offload_fraction": UNIT, "qk_clip_alpha": UNIT,
    "qk_clip_threshold": POSITIVE,
}
_FLOAT_UNIT = re.compile(r"(_dropout|_prob|_fraction|_rate)$|^(fim_rate|fim_spm_rate|sample_rate)$")
_FLOAT_NON_NEGATIVE = re.compile(r"(_coeff|_timeout|_interval|_time|_wait|_gb|_temp|_mult|_scale|_factor|_eps)$")


def numeric_range(arg: MegatronArg) -> Range | None:
    """The accepted range of a numeric argument (None: not numeric)."""
    if arg.type == "int" and not arg.choices:
        if arg.dest in _INT_SENTINELS:
            return (_INT_SENTINELS[arg.dest], True, None, False)
        if arg.dest in _INT_ZERO_ALLOWED or arg.default == 0:
            return NON_NEGATIVE
        return POSITIVE if _INT_POSITIVE.search(arg.dest) else NON_NEGATIVE
    if arg.type == "float":
        if arg.dest in _FLOAT_RANGES:
            return _FLOAT_RANGES[arg.dest]
        if _FLOAT_UNIT.search(arg.dest):
            return UNIT
        if _FLOAT_NON_NEGATIVE.search(arg.dest):
            return NON_NEGATIVE
        return ANY  # finite still (glu_linear_offset, activation clamps, ...)
    return None


def _bounds(bounds: Range) -> dict[str, float]:
    low, low_inclusive, high, high_inclusive = bounds
    out = {}
    if low is not None:
        out["ge" if low_inclusive else "gt"] = low
    if high is not None:
        out["le" if high_inclusive else "lt"] = high
    return out


# ---------------------------------------------------------------- field types

def _not_bool(value):
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    return value


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


def _number_as_text(value):
    """argparse stores the text it is given: ``split: 100`` (a YAML int) means the string '100'."""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _as_list(value):
    """``nargs`` arguments take a scalar too (Megatron-LM's own defaults are often scalars). Text is
    split on whitespace as Megatron-LM's command line splits it: AMD's ``train_data_path: "10
    /data/c4-train…"`` is a weight and a prefix."""
    if isinstance(value, str):
        return value.split() or [value]
    return [value] if value is not None and not isinstance(value, (list, tuple)) else value


# Megatron-LM's own argparse ``type=`` callables, by name, and what a YAML value may be for them.
_CUSTOM_TYPES: dict[str, Any] = {
    "moe_freq_type": int | str | list[int],  # 2, or "[1,0]*4" (Megatron-LM evaluates the pattern)
    "la_freq_type": int | str | list[int],
    "no_rope_freq_type": int | str | list[int],
    "tuple_type": str | list[int],  # window_size "(128, 0)" or [128, 0]
    "lambda": str,  # cuda_graph_scope: a CudaGraphScope member name or "full"
}


def _scalar_type(arg: MegatronArg):
    if arg.is_flag or arg.type == "bool":
        return bool
    if arg.choices and not arg.type == "bool":
        return Literal[tuple(arg.choices)]  # type: ignore[misc]
    bounds = numeric_range(arg)
    if arg.type == "int":
        return Annotated[int, Strict(), Field(**_bounds(bounds))]
    if arg.type == "float":
        return Annotated[float, BeforeValidator(_not_bool), BeforeValidator(_finite),
                         Field(allow_inf_nan=False, **_bounds(bounds))]
    if arg.type in _CUSTOM_TYPES:
        return _CUSTOM_TYPES[arg.type]
    return Annotated[str, BeforeValidator(_number_as_text)]  # type=str or none given: argparse keeps text


def field_type(arg: MegatronArg):
    scalar = _scalar_type(arg)
    if arg.is_list:
        length = {"min_length": arg.nargs, "max_length": arg.nargs} if isinstance(arg.nargs, int) else {}
        if arg.nargs == "+":
            length = {"min_length": 1}
        annotation = Annotated[list[scalar], BeforeValidator(_as_list), Field(**length)]  # type: ignore[valid-type]
    else:
        annotation = scalar
    if arg.default is None:
        annotation = annotation | None
    return annotation


class MegatronArgsBase(BaseModel):
    """Megatron-LM's argument namespace: one attribute per argument, plus what validation derived."""

    model_config = ConfigDict(extra="forbid")
    model: dict[str, Any] | None = None  # the neutral ModelSpec block, translated before validation
    _notes: list = PrivateAttr(default_factory=list)  # (key, value, reason, level) said at run time
    _given: set = PrivateAttr(default_factory=set)  # the arguments the experiment set (not defaults)
    _given_values: dict = PrivateAttr(default_factory=dict)  # their values as written, before Megatron-LM's rules

    def note(self, key: str, value: Any, reason: str, level: str = "info") -> None:
        """Remember a setting Primus (or Megatron-LM's own rules) chose, to be said once at run time."""
        self._notes.append((key, value, reason, level))

    @property
    def notes(self) -> list[tuple[str, Any, str, str]]:
        return list(self._notes)

    @property
    def given(self) -> set[str]:
        return set(self._given)

    @property
    def given_values(self) -> dict[str, Any]:
        return dict(self._given_values)

    @property
    def query_groups(self) -> int:
        return self.num_query_groups if self.group_query_attention else self.num_attention_heads


def _default(arg: MegatronArg):
    return list(arg.default) if isinstance(arg.default, (list, tuple)) else arg.default


@cache
def megatron_args_model() -> type[MegatronArgsBase]:
    """The pydantic model of every Megatron-LM argument (built once, ~670 fields)."""
    fields = {dest: (field_type(arg), Field(_default(arg))) for dest, arg in megatron_lm_table().items()}
    return create_model("MegatronArgs", __base__=MegatronArgsBase, **fields)


def argument_names() -> list[str]:
    return list(megatron_lm_table())


# ---------------------------------------------------------------- option spellings

@dataclass(frozen=True)
class OptionAlias:
    """A key spelled as a Megatron-LM option (``disable_bias_linear``) rather than its dest."""

    option: str  # the command-line option, e.g. --disable-bias-linear
    dest: str
    flag_value: Any = None  # for a flag: what giving it stores (argparse's const); None: a value option

    def value(self, given: Any, default: Any) -> Any:
        """What argparse would store: a flag given (true) stores its const, absent (false) the default."""
        if self.flag_value is None:
            return given
        if not isinstance(given, bool):
            raise ValueError(f"{self.option} is a flag: true or false")
        return self.flag_value if given else default


@cache
def option_aliases() -> dict[str, OptionAlias]:
    table = megatron_lm_table()
    seen: dict[str, list[OptionAlias]] = {}
    for dest, arg in table.items():
        for option in arg.options:
            name = option.lstrip("-").replace("-", "_")
            if name == dest or name in table:
                continue
            if arg.action == "store_true":
                flag = True
            elif arg.action == "store_false":
                flag = False
            elif arg.action == "boolean_optional":
                flag = not option.startswith("--no-")
            else:
                flag = None
            seen.setdefault(name, []).append(OptionAlias(option, dest, flag))
    return {name: aliases[0] for name, aliases in seen.items() if len(aliases) == 1}
