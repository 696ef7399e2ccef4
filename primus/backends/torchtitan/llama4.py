"""Llama 4 on TorchTitan 0.3.0: transformers' ``Llama4ForCausalLM`` under TorchTitan's trainer.

TorchTitan 0.3.0 removed its own llama4 model (pytorch/torchtitan d92336f, "deprecate llama4") and
ships ``torchtitan.experiments.transformers_modeling_backend``, its way to train a Hugging Face
model class with its trainer, FSDP and checkpointing. AMD Primus's presets name the model
``{name: llama4, flavor: 17bx16e | 17bx128e}``; here that block builds the backend's ``ModelSpec``
(flavor ``full``: every shape from the config.json ``hf_model`` points at) around a
``Llama4TextConfig`` made locally from the flavor below -- no Hub access; a run writes it as
``<run dir>/llama4_hf_config/config.json`` before the trainer starts.

The network is transformers' own code: ``Llama4TextMoe`` (sigmoid of the top-1 router logit scaling
the expert's *input*, plus a shared expert), dense/MoE interleaving, NoPE every 4th layer with
attention temperature tuning, chunked attention and L2 qk-norm on the RoPE layers. The backend swaps
HF MoE blocks for TorchTitan's MoE only where a layer's block is called ``mlp``; Llama 4's is
``feed_forward``, so its MoE is kept as HF wrote it (the equivalence test in
``tests/backends/torchtitan/test_llama4.py`` compares logits with ``Llama4ForCausalLM``). What that
gives up: TorchTitan's expert parallelism, tensor parallelism of the HF experts and its aux-loss-free
load balancing -- refused or said below. Four upstream defects the backend has for this model are
fixed by named patches (``patches.py``: layer_idx on ``feed_forward``, RoPE buffers, chunked
attention masks, SDPA on CPU). ``model.converters.float8`` swaps the built model's ``nn.Linear`` layers
to torchao's ``Float8Linear`` (``float8.py``); the experts' 3-D weights and the router stay in high
precision.

Shapes, per flavor, and where each comes from:

- TorchTitan's llama4 flavors before their removal, ``torchtitan/models/llama4/__init__.py`` at
  pytorch/torchtitan 43e52fd017ce8689cb0b34c62a35daac9910c6c1: dim 5120, 48 layers, 40 heads, 8 KV
  heads, vocab 202048, dense FFN ``compute_ffn_hidden_dim(5120, multiple_of=2048,
  ffn_dim_multiplier=1.2)`` = 16384, expert FFN ``compute_moe_hidden_dim(...)`` = 8192, 16 / 128
  experts, top-1, one shared expert of the expert width, RoPE theta 500000; Scout with llama RoPE
  scaling factor 16, high_freq_factor 1.0 (low_freq_factor 1.0, original context 8192: RoPE config
  defaults), Maverick without scaling; NoPE every 4th layer.
- transformers 5.18.0 ``Llama4TextConfig`` (its defaults are Scout's text config): head_dim 128,
  rms_norm_eps 1e-5, NoPE on layers with ``(i + 1) % 4 == 0``, qk-norm on, attention chunk 8192,
  temperature tuning (floor_scale 8192, attn_scale 0.1), ``max_position_embeddings``.
- Where the two disagree, the published network wins: Maverick interleaves dense and MoE layers
  (``interleave_moe_layer_step: 2``; AMD Primus's Megatron preset ``moe_layer_freq: 2``, fd1eeab;
  TorchTitan's flavor made every layer MoE, 773B parameters instead of ~400B) and has no qk-norm
  (transformers' modeling code: "the 128E model does not use qk_norm"); NoPE layers follow
  transformers (TorchTitan's flavor put them on ``i % 4 == 0``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from primus.plan.model import ModelSpec

NAME = "llama4"
TORCHTITAN_SOURCE = "pytorch/torchtitan 43e52fd017ce8689cb0b34c62a35daac9910c6c1 torchtitan/models/llama4/__init__.py"
TRANSFORMERS_SOURCE = "transformers 5.18.0 Llama4TextConfig"
CONFIG_DIR = "llama4_hf_config"  # under the run directory

_SCOUT_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0, "low_freq_factor": 1.0,
               "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}
_COMMON = dict(vocab_size=202048, hidden_size=5120, num_hidden_layers=48, num_attention_heads=40,
               num_key_value_heads=8, head_dim=128, intermediate_size=8192, intermediate_size_mlp=16384,
               num_experts_per_tok=1, rms_norm_eps=1e-5, no_rope_layer_interval=4, attention_chunk_size=8192,
               attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1, tie_word_embeddings=False)

# Llama4TextConfig keyword arguments per flavor.
FLAVORS: dict[str, dict[str, Any]] = {
    # Llama 4 Scout 17B-16E: MoE in every layer.
    "17bx16e": {**_COMMON, "num_local_experts": 16, "interleave_moe_layer_step": 1, "use_qk_norm": True,
                "max_position_embeddings": 10485760, "rope_parameters": _SCOUT_ROPE},
    # Llama 4 Maverick 17B-128E: MoE every 2nd layer, no qk-norm, no RoPE scaling.
    "17bx128e": {**_COMMON, "num_local_experts": 128, "interleave_moe_layer_step": 2, "use_qk_norm": False,
                 "max_position_embeddings": 1048576,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
    # TorchTitan's llama4 debugmodel (same source): dim 256, 16 heads, 6 layers, vocab 2048, 8 experts,
    # MoE every 2nd layer, expert FFN compute_moe_hidden_dim(256) = 512, dense compute_ffn_hidden_dim(256) = 768.
    "debugmodel": {**_COMMON, "vocab_size": 2048, "hidden_size": 256, "num_hidden_layers": 6,
                   "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 16, "intermediate_size": 512,
                   "intermediate_size_mlp": 768, "num_local_experts": 8, "interleave_moe_layer_step": 2,
                   "use_qk_norm": True, "max_position_embeddings": 1048576,
                   "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
}

# Keys of the model block besides name/flavor (RegistryModel's): the Llama4TextConfig field each sets.
OVERRIDES = {"n_layers": "num_hidden_layers", "vocab_size": "vocab_size", "num_experts": "num_local_experts",
             "top_k": "num_experts_per_tok"}
# Parallelisms the backend does not apply to transformers' Llama 4 modules, and why.
UNSUPPORTED_PARALLELISM = {
    "expert_parallel_degree": "TorchTitan's expert parallelism shards its own MoE modules; Llama 4's MoE is "
                              "transformers' Llama4TextMoe here (kept so the routing math stays Llama 4's)",
    "tensor_parallel_degree": "the transformers backend's tensor-parallel plan does not cover Llama 4's "
                              "feed_forward/experts modules",
    "context_parallel_degree": "Llama 4's chunked/full attention masks are built per layer type, which the "
                               "backend's context-parallel mask sharding does not handle",
    "pipeline_parallel_degree": "not checked for Llama 4 on the transformers backend",
}


def text_config(flavor: str, overrides: dict[str, Any] | None = None):
    """The ``Llama4TextConfig`` of a flavor, with the model block's overrides applied."""
    from transformers import Llama4TextConfig

    kwargs = dict(FLAVORS[flavor])
    for key, value in (overrides or {}).items():
        if value is not None:
            kwargs[OVERRIDES[key]] = value
    config = Llama4TextConfig(**kwargs)
    config.architectures = ["Llama4ForCausalLM"]
    return config


def config_json(config) -> str:
    return config.to_json_string(use_diff=False)


def write_hf_config(directory: str | os.PathLike, text: str) -> Path:
    """``config.json`` for the backend's ``hf_model`` (written atomically: every rank may write it)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "config.json"
    if not target.exists() or target.read_text() != text:
        tmp = directory / f".config.json.{os.getpid()}"
        tmp.write_text(text)
        os.replace(tmp, target)
    return target


def titan_spec(flavor: str, config):
    """TorchTitan's transformers-backend ``ModelSpec`` (flavor ``full``: shapes from config.json), named llama4."""
    import dataclasses

    from torchtitan.experiments.transformers_modeling_backend import model_registry

    spec = model_registry("full")
    spec.model._primus_hf_config = config_json(config)  # written next to the run by the adapter
    return dataclasses.replace(spec, name=NAME, flavor=flavor)


def neutral_spec(config, flavor: str) -> ModelSpec:
    """What ``primus plan`` counts: the dense layers' FFN is ``intermediate_size_mlp``, each MoE layer has
    ``num_local_experts`` experts of ``intermediate_size`` plus one shared expert of the same width. The
    qk-norm is a weightless L2 norm (no parameters)."""
    moe_layers = set(config.moe_layers)
    rope = config.rope_parameters or {}
    return ModelSpec(
        family=f"llama4 {flavor}", n_layers=config.num_hidden_layers, dim=config.hidden_size,
        n_heads=config.num_attention_heads, n_kv_heads=config.num_key_value_heads, head_dim=config.head_dim,
        vocab_size=config.vocab_size, norm_eps=config.rms_norm_eps, tie_embeddings=config.tie_word_embeddings,
        ffn_hidden_size=config.intermediate_size_mlp, rope_theta=float(rope.get("rope_theta", 500000.0)),
        rope_scaling="llama" if rope.get("rope_type") == "llama3" else None,
        n_experts=config.num_local_experts, top_k=config.num_experts_per_tok,
        moe_ffn_hidden_size=config.intermediate_size, shared_expert_ffn_hidden_size=config.intermediate_size,
        moe_layer_freq=[int(i in moe_layers) for i in range(config.num_hidden_layers)],
    )


def parallelism_problem(parallelism: Any) -> tuple[str, str] | None:
    """``(key, reason)`` for the first parallelism Llama 4 cannot use on this backend, else None."""
    for key, reason in UNSUPPORTED_PARALLELISM.items():
        value = getattr(parallelism, key, 1)
        if value > 1:
            return f"parallelism.{key}", f"{value}: {reason}; Llama 4 runs with FSDP / data parallelism here (set it to 1)"
    return None


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    return json.loads(Path(path).read_text())
