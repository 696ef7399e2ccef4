"""A model from TorchTitan's own registry, by name and flavor: ``model: {name: qwen3, flavor: 30B-A3B}``.

This is how AMD Primus's TorchTitan presets name a model, and it reaches every model TorchTitan
0.3.0 ships (llama3, qwen3 dense and MoE, deepseek_v3, gpt_oss, ...) exactly as TorchTitan builds
it: ``torchtitan.models.<name>.model_registry(flavor, ...)``. Around the flavor, a few keys:

- ``n_layers``: keep the first n layers of the flavor, each as configured (init included);
  AMD's presets use it to shorten a model for debugging;
- ``vocab_size``: embedding, output head (and the loss) at another vocabulary size;
- ``num_experts``, ``top_k``, ``load_balance_coeff``: every MoE layer's router, experts and
  token dispatcher together;
- any other keyword of that model's ``model_registry`` (``num_mtp_layers``, ``moe_comm_backend``, ...).

On CPU the attention kernel is swapped for causal SDPA (FlexAttention has no CPU backward in
torch 2.13), as for the neutral Llama block; gpt-oss keeps FlexAttention (its attention sinks need
the softmax normaliser), so it plans and validates anywhere and trains on GPU.
"""
from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from primus.config.errors import ConfigError, did_you_mean

# Models of TorchTitan's registry that are decoder-only LLMs trained by its own Trainer
# (flux is a diffusion model with its own trainer).
NOT_LLM = frozenset({"flux"})
# model_registry keywords Primus sets itself (attention from attn_backend; converters are a
# TorchTitan-level feature Primus does not expose yet).
OWN_KEYWORDS = frozenset({"flavor", "attn_backend", "converters"})

Fail = Callable[[str, str], ConfigError]


class RegistryModel(BaseModel):
    """The keys of a registry ``model:`` block that Primus interprets itself."""

    model_config = ConfigDict(extra="allow")

    name: str
    flavor: str
    n_layers: int | None = Field(None, gt=0, strict=True)
    vocab_size: int | None = Field(None, gt=0, strict=True)
    num_experts: int | None = Field(None, gt=0, strict=True)
    top_k: int | None = Field(None, gt=0, strict=True)
    load_balance_coeff: float | None = Field(None, gt=0, allow_inf_nan=False)


def _suggest(word: str, names) -> str:
    """did-you-mean ignoring case: flavors mix "8B", "20b" and "30B-A3B"."""
    by_lower = {str(name).lower(): str(name) for name in names}
    match = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.6)
    return f" (did you mean '{by_lower[match[0]]}'?)" if match else ""


def is_registry_model(block: dict[str, Any]) -> bool:
    return "name" in block or "flavor" in block


def known_models() -> list[str]:
    from torchtitan.models import _supported_models

    return sorted(_supported_models - NOT_LLM)


def flavors(name: str) -> dict[str, Callable]:
    """``{flavor: builder}`` of one model package (``llama3_configs``, ``gptoss_configs``, ...)."""
    module = importlib.import_module(f"torchtitan.models.{name}")
    tables = [value for key, value in vars(module).items() if key.endswith("_configs") and isinstance(value, dict)]
    return tables[0] if tables else {}


def registry_keywords(name: str) -> set[str]:
    module = importlib.import_module(f"torchtitan.models.{name}")
    return set(inspect.signature(module.model_registry).parameters) - OWN_KEYWORDS


def parse(block: dict[str, Any], validate: Callable[[type[BaseModel], dict], BaseModel], fail: Fail) -> RegistryModel:
    """Check the block's name, flavor and keys against the installed TorchTitan."""
    if "name" not in block or "flavor" not in block:
        missing = "name" if "name" not in block else "flavor"
        raise fail(f"model.{missing}", "missing: a TorchTitan registry model is named by `name` and `flavor` "
                                       "(or use the neutral Llama keys n_layers, dim, ... without them)")
    model = validate(RegistryModel, block)
    models = known_models()
    if model.name not in models:
        raise fail("model.name", f"'{model.name}' is not a TorchTitan model{did_you_mean(model.name, models)}; "
                                 f"known: {', '.join(models)}")
    table = flavors(model.name)
    if model.flavor not in table:
        raise fail("model.flavor", f"'{model.flavor}' is not a flavor of TorchTitan's {model.name}"
                                   f"{_suggest(model.flavor, table)}; known: {', '.join(table)}")
    keywords = registry_keywords(model.name)
    for key in model.model_extra or {}:
        if key not in keywords:
            allowed = [*RegistryModel.model_fields, *sorted(keywords)]
            raise fail(f"model.{key}", f"unknown key for TorchTitan's {model.name} model{did_you_mean(key, allowed)}; "
                                       f"known: {', '.join(allowed)}")
    return model


def build(model: RegistryModel, attn_backend: str, fail: Fail):
    """TorchTitan's ``ModelSpec`` for the block, with the overrides applied."""
    module = importlib.import_module(f"torchtitan.models.{model.name}")
    accepted = inspect.signature(module.model_registry).parameters
    kwargs = dict(model.model_extra or {})
    if "attn_backend" in accepted:
        kwargs["attn_backend"] = "flex" if attn_backend == "sdpa" else attn_backend
    try:
        spec = module.model_registry(model.flavor, **kwargs)
    except (TypeError, ValueError, AssertionError) as exc:
        raise fail("model", f"TorchTitan's {model.name} {model.flavor}: {exc}") from None
    config = spec.model
    if attn_backend == "sdpa":
        _use_sdpa(config)
    if model.n_layers is not None:
        if model.n_layers > len(config.layers):
            raise fail("model.n_layers", f"{model.n_layers} is more than the {len(config.layers)} layers of "
                                         f"{model.name} {model.flavor} (n_layers keeps the first n)")
        config.layers = config.layers[:model.n_layers]
    if model.vocab_size is not None:
        config.vocab_size = config.tok_embeddings.num_embeddings = config.lm_head.out_features = model.vocab_size
    _set_moe(config, model, fail)
    return spec


def has_attention_sinks(config: Any) -> bool:
    """gpt-oss rescales attention by learned sinks, which needs the softmax normaliser SDPA does not return."""
    from torchtitan.models.common.attention import BaseAttention

    return any("sinks" in (attention.param_init or {}) for _, attention, _, _ in config.traverse(BaseAttention.Config))


def _use_sdpa(config: Any) -> None:
    """Causal SDPA in place of every attention kernel of the model (CPU), unless it needs sinks."""
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention, VarlenAttention

    if has_attention_sinks(config):
        return  # flex kept: plan and validate work; training on CPU fails in torch's FlexAttention backward
    for kind in (FlexAttention.Config, VarlenAttention.Config):
        for _, _, parent, attr in list(config.traverse(kind)):
            setattr(parent, attr, ScaledDotProductAttention.Config())


def _set_moe(config: Any, model: RegistryModel, fail: Fail) -> None:
    """num_experts / top_k / load_balance_coeff on every MoE layer, kept consistent across its parts."""
    from torchtitan.models.common.moe import MoE

    moes = [moe for _, moe, _, _ in config.traverse(MoE.Config)]
    wanted = {k: getattr(model, k) for k in ("num_experts", "top_k", "load_balance_coeff") if getattr(model, k) is not None}
    if wanted and not moes:
        key = next(iter(wanted))
        raise fail(f"model.{key}", f"{model.name} {model.flavor} has no MoE layers")
    for moe in moes:
        routed = moe.routed_experts
        if model.num_experts is not None:
            moe.num_experts = moe.router.num_experts = moe.router.gate.out_features = model.num_experts
            routed.inner_experts.num_experts = routed.token_dispatcher.num_experts = model.num_experts
        if model.top_k is not None:
            moe.router.top_k = routed.token_dispatcher.top_k = model.top_k
        if model.load_balance_coeff is not None:
            moe.load_balance_coeff = model.load_balance_coeff
        if moe.router.top_k > moe.num_experts:
            raise fail("model.top_k", f"top_k {moe.router.top_k} is more than the {moe.num_experts} experts")


def validator(provenance, prefix: str) -> Callable[[type[BaseModel], dict], BaseModel]:
    """``validate(schema, data)`` reporting errors at ``{prefix}.model.<key>`` with their source."""
    from primus.config.provenance import Provenance
    from primus.config.schema import validate_model

    def validate(schema: type[BaseModel], data: dict) -> BaseModel:
        return validate_model(schema, data, provenance or Provenance(), f"{prefix}.model")

    return validate

