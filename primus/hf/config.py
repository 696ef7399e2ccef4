"""A Hugging Face ``config.json`` <-> Primus' neutral ``ModelSpec``.

The families Primus can start from and export to: Llama (2, 3, 3.1 RoPE scaling), Mistral
without a sliding window, Qwen2 (biases on Q/K/V), Qwen3 (per-head Q/K RMSNorm, own head_dim)
and Mixtral-style MoE. Anything the engines would silently compute differently (another
activation, MLP biases, a sliding window, another RoPE scaling) is refused with one line.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from primus.config.errors import ConfigError
from primus.plan.model import ModelSpec

# model_type -> (HF architecture, ModelSpec.family)
FAMILIES = {
    "llama": ("LlamaForCausalLM", "llama3"),
    "mistral": ("MistralForCausalLM", "mistral"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "mixtral": ("MixtralForCausalLM", "mixtral"),
}
# ModelSpec.family -> HF model_type, for a model that did not come from a config.json
_FAMILY_TO_TYPE = {"llama2": "llama", "llama3": "llama", "llama3.1": "llama", "llama3.2": "llama",
                   **{family: model_type for model_type, (_, family) in FAMILIES.items()}}
# Llama 3.1's long-context RoPE scaling: the only one the engines implement (ModelSpec.rope_scaling "llama")
LLAMA31_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def read_config(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir).expanduser() / "config.json"
    if not path.is_file():
        raise ConfigError(f"{Path(model_dir)}: not a Hugging Face model folder (no config.json)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc.msg})") from None


def _rope(config: dict[str, Any], where: str) -> tuple[float, str | None]:
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return float(theta), None
    values = {**scaling, **params}
    if kind == "llama3" and all(float(values.get(k, -1)) == v for k, v in LLAMA31_ROPE.items()):
        return float(theta), "llama"
    raise ConfigError(f"{where}: RoPE scaling {kind!r} with {values} is not supported (only Llama 3.1's "
                      f"llama3 scaling with {LLAMA31_ROPE})")


def model_spec_from_hf(config: dict[str, Any], where: str = "config.json") -> ModelSpec:
    """The neutral model of a HF config; unsupported features are one ConfigError."""
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise ConfigError(f"{where}: model_type {model_type!r} is not supported "
                          f"(supported: {', '.join(sorted(FAMILIES))})")
    if config.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"{where}: hidden_act {config['hidden_act']!r}: only SwiGLU (silu) MLPs are supported")
    if config.get("mlp_bias"):
        raise ConfigError(f"{where}: mlp_bias is not supported")
    if config.get("use_sliding_window") or (model_type in ("mistral", "mixtral") and config.get("sliding_window")):
        raise ConfigError(f"{where}: sliding-window attention is not supported")
    theta, scaling = _rope(config, where)
    dim, heads = config["hidden_size"], config["num_attention_heads"]
    moe = model_type == "mixtral"
    fields = dict(
        family=FAMILIES[model_type][1],
        n_layers=config["num_hidden_layers"], dim=dim, n_heads=heads,
        n_kv_heads=config.get("num_key_value_heads") or heads,
        ffn_hidden_size=config["intermediate_size"],
        vocab_size=config["vocab_size"],
        rope_theta=theta, rope_scaling=scaling,
        norm_eps=config.get("rms_norm_eps", 1e-6),
        max_seq_len=config.get("max_position_embeddings", 2048),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        head_dim=config.get("head_dim") or dim // heads,
        qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
        qk_norm=model_type == "qwen3",
    )
    if moe:
        fields.update(n_experts=config["num_local_experts"], top_k=config["num_experts_per_tok"],
                      moe_ffn_hidden_size=config["intermediate_size"])
    try:
        return ModelSpec(**fields)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def hf_model_type(spec: ModelSpec) -> str:
    if spec.is_moe:
        return "mixtral"
    if spec.qk_norm:
        return "qwen3"
    if spec.qkv_bias:
        return "qwen2"
    return _FAMILY_TO_TYPE.get(spec.family, "llama")


def hf_config_from_spec(spec: ModelSpec, *, dtype: str = "float32", tokens: dict[str, int | None] | None = None) -> dict[str, Any]:
    """A config.json for a model Primus built from a preset (no HF source to copy)."""
    if spec.is_mla:
        raise ConfigError("export: multi-latent attention models have no Hugging Face mapping here yet")
    from transformers import AutoConfig

    model_type = hf_model_type(spec)
    rope = {"rope_type": "default", "rope_theta": spec.rope_theta}
    if spec.rope_scaling == "llama":
        rope = {"rope_type": "llama3", "rope_theta": spec.rope_theta, **LLAMA31_ROPE}
    kwargs = dict(
        vocab_size=spec.vocab_size, hidden_size=spec.dim, intermediate_size=spec.moe_ffn_hidden_size if spec.is_moe
        else spec.ffn_dim, num_hidden_layers=spec.n_layers, num_attention_heads=spec.n_heads,
        num_key_value_heads=spec.kv_heads, head_dim=spec.head_dim, max_position_embeddings=spec.max_seq_len,
        rms_norm_eps=spec.norm_eps, tie_word_embeddings=spec.tie_embeddings, rope_parameters=rope,
        **(tokens or {}),
    )
    if model_type == "llama" and spec.qkv_bias:
        kwargs["attention_bias"] = True
    if spec.is_moe:
        kwargs.update(num_local_experts=spec.n_experts, num_experts_per_tok=spec.top_k)
    config = AutoConfig.for_model(model_type, **kwargs).to_dict()
    config.update(architectures=[FAMILIES[model_type][0]], dtype=dtype)
    return config
