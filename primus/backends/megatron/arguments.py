"""Megatron backend configuration, spelled with Megatron-LM's own argument names.

Users coming from Megatron-LM (or AMD Primus YAMLs) write the flat keys they know: every one of
Megatron-LM's ~670 arguments (``schema.py``, generated from its ``arguments.py``), by its
argparse dest (``add_bias_linear: false``) or by its option (``disable_bias_linear: true``). An
unknown key is an error with a did-you-mean, never ignored. Megatron-LM's own ``validate_args``
rules then complete and check the namespace (``validate_args.py``); what this backend does with
each argument is ``support.py``'s business, at run time.

A ``model:`` block of neutral ``ModelSpec`` keys (the preset TorchTitan also reads) may sit
beside the flat keys; it is translated first and flat keys given explicitly override it.
Nothing here imports megatron-core.
"""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from primus.backends.megatron.schema import (
    MegatronArgsBase,
    argument_names,
    megatron_args_model,
    megatron_lm_table,
    option_aliases,
)
from primus.backends.megatron.validate_args import (
    apply_megatron_lm_rules,
    check_parallel_layout,
    virtual_pipeline_size,
)
from primus.config.errors import ConfigError, did_you_mean
from primus.plan.model import ModelSpec

__all__ = ["MegatronArgs", "parse_args", "translate_neutral_model", "check_parallel_layout", "default_args",
           "virtual_pipeline_size", "TRANSLATED_KEYS"]

MegatronArgs = MegatronArgsBase  # the parsed namespace (a pydantic model with one field per argument)


def translate_neutral_model(model: dict[str, Any]) -> dict[str, Any]:
    """A ``model:`` block of ``ModelSpec`` keys -> Megatron-LM arguments (dests) for the same network."""
    spec = ModelSpec(**model)
    args = {
        "num_layers": spec.n_layers,
        "hidden_size": spec.dim,
        "num_attention_heads": spec.n_heads,
        "group_query_attention": spec.kv_heads != spec.n_heads,
        "num_query_groups": spec.kv_heads,
        "ffn_hidden_size": spec.ffn_dim,
        "kv_channels": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "rotary_base": int(spec.rope_theta),  # Megatron-LM's --rotary-base is an int
        "use_rope_scaling": spec.rope_scaling == "llama",
        "layernorm_epsilon": spec.norm_eps,
        "max_position_embeddings": spec.max_seq_len,
        "swiglu": True,
        "normalization": "RMSNorm",
        "position_embedding_type": "rope",
        "untie_embeddings_and_output_weights": not spec.tie_embeddings,
        "add_bias_linear": False,  # Llama-family models have no biases in their linear layers
        "add_qkv_bias": spec.qkv_bias,  # ... except Qwen2's Q/K/V
        "qk_layernorm": spec.qk_norm,
        "attention_dropout": 0.0,  # nor dropout
        "hidden_dropout": 0.0,
        # Only when asked: None keeps megatron-core's default (init_method_std).
        **({"embedding_init_method_std": spec.embedding_init_std} if spec.embedding_init_std is not None else {}),
    }
    if spec.is_mla:
        args.update(multi_latent_attention=True, q_lora_rank=spec.q_lora_rank, kv_lora_rank=spec.kv_lora_rank,
                    qk_head_dim=spec.qk_nope_head_dim, qk_pos_emb_head_dim=spec.qk_rope_head_dim,
                    v_head_dim=spec.v_head_dim)
    if spec.is_moe:
        args.update(num_experts=spec.n_experts, moe_router_topk=spec.top_k, moe_layer_freq=spec.moe_layer_freq,
                    moe_ffn_hidden_size=spec.moe_ffn_hidden_size or spec.ffn_dim,
                    moe_shared_expert_intermediate_size=spec.shared_expert_ffn_hidden_size or None)
    if spec.mtp_layers:
        args["mtp_num_layers"] = spec.mtp_layers
    return args


# Every key the translation can produce: never given a default below the model preset.
TRANSLATED_KEYS = frozenset(translate_neutral_model({
    "n_layers": 2, "dim": 64, "n_heads": 4, "vocab_size": 8, "embedding_init_std": 1.0, "kv_lora_rank": 8,
    "q_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8, "n_experts": 2, "top_k": 1,
    "mtp_layers": 1}))


def _where(provenance, dotted: str) -> str:
    describe = getattr(provenance, "describe", None)
    location = describe(dotted) if describe else None
    return f"{location}: " if location else ""


def _dests_from_options(params: dict[str, Any], module: str, provenance) -> dict[str, Any]:
    """Keys spelled as Megatron-LM options (``norm_epsilon``, ``disable_bias_linear``) -> their dests."""
    aliases, table = option_aliases(), megatron_lm_table()
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in params.items():
        alias = aliases.get(key)
        if alias is None:
            dest = key
        else:
            dest = alias.dest
            try:
                value = alias.value(value, table[dest].default)
            except ValueError as exc:
                dotted = f"modules.{module}.{key}"
                raise ConfigError(f"{_where(provenance, dotted)}{dotted}: {exc} (got {value!r})") from None
        if dest in out:
            other = spelled.get(dest, dest)
            dotted = f"modules.{module}.{key}"
            raise ConfigError(f"{_where(provenance, dotted)}{dotted}: the same Megatron-LM argument as '{other}' "
                              f"({', '.join(table[dest].options)}); give one of them")
        out[dest] = value
        spelled[dest] = key
    return out


def parse_args(params: dict[str, Any], *, module: str = "pre_trainer", provenance=None) -> MegatronArgs:
    """Merge the neutral model block under the flat keys, validate against Megatron-LM's table and
    apply its validate_args rules; user errors -> ConfigError (one line, the dotted key)."""
    params = dict(params)
    model = params.get("model")
    merged: dict[str, Any] = {}
    if model is not None:
        try:
            merged.update(translate_neutral_model(model))
        except (ValidationError, TypeError) as exc:
            raise _config_error(exc, f"modules.{module}.model", ModelSpec.model_fields, provenance) from None
    flat = _dests_from_options({k: v for k, v in params.items() if k != "model"}, module, provenance)
    # null for an argument Megatron-LM never leaves unset (AMD's `moe_flex_dispatcher_backend: null`):
    # its command line cannot say null, so the argument is not given and keeps Megatron-LM's default
    table = megatron_lm_table()
    unset = [k for k, v in flat.items() if v is None and k in table and table[k].default is not None]
    merged.update({k: v for k, v in flat.items() if k not in unset})
    try:
        args = megatron_args_model()(**merged, model=model)
    except ValidationError as exc:
        raise _config_error(exc, f"modules.{module}", [*argument_names(), *option_aliases()], provenance) from None
    for key in unset:
        args.note(key, table[key].default, "null: not given (Megatron-LM's command line has no null), its default")
    args._given = set(merged)  # what the experiment set (admission checks only these)
    args._given_values = dict(merged)  # as written: a rule that changes one says so in a differs: line
    apply_megatron_lm_rules(args, module=module)
    check_parallel_layout(args, world_size=None, module=module)
    return args


def _config_error(exc: Exception, prefix: str, names, provenance) -> ConfigError:
    if not isinstance(exc, ValidationError):
        return ConfigError(f"{_where(provenance, prefix)}{prefix}: {exc}")
    error = exc.errors()[0]
    key = ".".join(str(part) for part in error["loc"])
    dotted = f"{prefix}.{key}" if key else prefix
    where = _where(provenance, dotted)
    if error["type"] == "extra_forbidden":
        return ConfigError(f"{where}{dotted}: unknown Megatron argument{did_you_mean(key, names)}")
    value = error.get("input")
    shown = f" (got {value!r})" if key and not isinstance(value, dict) else ""
    return ConfigError(f"{where}{dotted}: {error['msg']}{shown}")


def default_args() -> dict[str, Any]:
    """The backend-defaults layer: empty. Megatron-LM's defaults are the schema's own (applied when
    a key is absent), so no default can hide a model preset's value or an option spelling."""
    return {}
