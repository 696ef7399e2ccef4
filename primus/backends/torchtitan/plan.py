"""TorchTitan settings -> the backend-neutral (model, layout) pair ``primus plan`` estimates.

A neutral ``model:`` block is already a ``ModelSpec``. A registry model (``model: {name, flavor}``)
is read from the config tree TorchTitan itself builds (``model_spec_from_titan``), so the plan
describes the very network the engine trains: dense or MoE layers, GQA or MLA attention, shared
experts, MTP layers. ``parallel_layout`` reads the parallelism settings.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from primus.plan.model import ModelSpec


def _world_size(given: int | None = None) -> int:
    if given:
        return given
    if os.environ.get("WORLD_SIZE"):
        return int(os.environ["WORLD_SIZE"])
    return int(os.environ.get("GPUS_PER_NODE", "1")) * int(os.environ.get("NNODES", "1"))


def _attention_fields(attention: Any) -> dict[str, Any]:
    if hasattr(attention, "kv_lora_rank"):  # multi-latent attention (DeepSeek)
        return {
            "n_heads": attention.n_heads,
            "q_lora_rank": attention.q_lora_rank or None,  # 0: queries projected directly
            "kv_lora_rank": attention.kv_lora_rank,
            "qk_nope_head_dim": attention.qk_nope_head_dim,
            "qk_rope_head_dim": attention.qk_rope_head_dim,
            "v_head_dim": attention.v_head_dim,
            "head_dim": attention.qk_nope_head_dim + attention.qk_rope_head_dim,
            "qk_norm": True,  # TorchTitan's MLA always normalises its latents (kv_norm; q_norm with q LoRA)
        }
    qkv = attention.qkv_linear
    projection = getattr(qkv, "wqkv", None) or getattr(qkv, "wq", None)
    return {
        "n_heads": qkv.n_heads,
        "n_kv_heads": qkv.n_kv_heads,
        "head_dim": qkv.head_dim,
        "qkv_bias": bool(projection is not None and projection.bias),
        "linear_bias": bool(attention.wo.bias),  # gpt-oss: every linear has a bias (its experts' too)
        "qk_norm": getattr(attention, "qk_norm", None) is not None,
    }


def _rope_fields(rope: Any) -> dict[str, Any]:
    if rope is None:
        return {}
    return {"rope_theta": float(rope.theta), "max_seq_len": rope.max_seq_len,
            "rope_scaling": "llama" if rope.scaling == "llama" else None}


def model_spec_from_titan(config: Any, family: str) -> ModelSpec:
    """The neutral description of a TorchTitan decoder config (``ModelSpec.model``)."""
    layers = list(config.layers)
    first = layers[0]
    moe_layers = [layer.moe for layer in layers if getattr(layer, "moe", None) is not None]
    dense_layers = [layer.feed_forward for layer in layers if getattr(layer, "feed_forward", None) is not None]
    fields: dict[str, Any] = {
        "family": family,
        "n_layers": len(layers),
        "dim": config.dim,
        "vocab_size": config.vocab_size,
        "norm_eps": first.attention_norm.eps,
        "tie_embeddings": bool(getattr(config, "enable_weight_tying", False)),
        "mtp_layers": len(getattr(config, "mtp_layers", None) or []),
        **_attention_fields(first.attention),
        **_rope_fields(getattr(first.attention, "rope", None)),
    }
    if dense_layers:
        fields["ffn_hidden_size"] = dense_layers[0].w1.out_features
    if moe_layers:
        moe = moe_layers[0]
        shared = moe.shared_experts
        fields.update({
            "n_experts": moe.num_experts,
            "top_k": moe.router.top_k,
            "moe_ffn_hidden_size": moe.routed_experts.inner_experts.hidden_dim,
            "shared_expert_ffn_hidden_size": shared.w1.out_features if shared is not None else 0,
            "moe_layer_freq": [int(getattr(layer, "moe", None) is not None) for layer in layers],
        })
    return ModelSpec(**fields)


def parallel_layout(params: dict[str, Any], world_size: int | None = None, n_layers: int | None = None,
                    device: str = "cpu"):
    """The ``ParallelLayout``. ``data_parallel_shard_degree: -1`` fills the world (``world_size``
    when the launcher knows it, else ``WORLD_SIZE`` or ``GPUS_PER_NODE x NNODES``, else 1), as
    TorchTitan does at start-up. Memory as TorchTitan lays it out: FSDP2 on every parameter (a shard
    group of one included), parameters and gradients kept in fp32 and computed in
    ``mixed_precision_param``, sequence parallelism with tensor parallelism, a chunked loss."""
    from primus.plan.layout import ParallelLayout

    training = params.get("training") or {}
    parallel = params.get("parallelism") or {}
    tp = parallel.get("tensor_parallel_degree", 1)
    pp = parallel.get("pipeline_parallel_degree", 1)
    cp = parallel.get("context_parallel_degree", 1)
    replicate = parallel.get("data_parallel_replicate_degree", 1)
    shard = parallel.get("data_parallel_shard_degree", -1)
    if shard < 1:
        shard = max(1, _world_size(world_size) // (tp * pp * cp * replicate))
    mode = (params.get("activation_checkpoint") or {}).get("mode", "selective")
    global_batch = training.get("global_batch_size", -1)
    local = training.get("local_batch_size", 8)
    micro = parallel.get("pipeline_parallel_microbatch_size", 1) if pp > 1 else local
    compute = "bf16" if training.get("mixed_precision_param", "bfloat16") == "bfloat16" else "fp32"
    return ParallelLayout(
        tp=tp, pp=pp, cp=cp, dp=replicate * shard, ep=parallel.get("expert_parallel_degree", 1),
        micro_batch_size=micro,
        global_batch_size=(global_batch if global_batch and global_batch > 0 else local * replicate * shard),
        seq_len=training.get("seq_len", 2048),
        recompute=mode == "full", selective_recompute=mode == "selective",
        sharding="fsdp", dp_shard=shard, param_dtype="fp32", activation_dtype=compute, master_weights=False,
        grad_dtype="bf16" if training.get("mixed_precision_reduce", "float32") == "bfloat16" else "fp32",
        pipeline_layout=_stage_layout(parallel, pp, n_layers) if pp > 1 and n_layers else None,
        sequence_parallel=tp > 1 and parallel.get("enable_sequence_parallel", True), memory_model="torchtitan",
        gpu=device.startswith("cuda"),
        loss_chunks=((params.get("loss") or {}).get("num_chunks") or 8),
    )


def _stage_layout(parallel: dict[str, Any], pp: int, n_layers: int) -> str:
    """TorchTitan's split of layers over pipeline stages (``_generate_llm_fqn_per_model_part``: the
    embedding and the output head count as ``first/last_stage_less_layers`` layers each, the rest evenly,
    earlier stages one more), in Megatron's layout notation. One stage per rank (single-stage schedules)."""
    first = parallel.get("pipeline_parallel_first_stage_less_layers", 1)
    last = parallel.get("pipeline_parallel_last_stage_less_layers", 1)
    effective = n_layers + first + last
    per, extra = divmod(effective, pp)
    stages, layer = [], 0
    for rank in range(pp):  # each pipeline rank's layers
        share = per + (1 if rank < extra else 0) - (first if rank == 0 else last if rank == pp - 1 else 0)
        count = max(0, min(share, n_layers - layer))
        layer += count
        stages.append(("E" if rank == 0 else "") + "t" * count + ("L" if rank == pp - 1 else ""))
    return "|".join(stages)


# ---- `primus plan` without TorchTitan: the registry read once by tools/gen_torchtitan_plan_table.py ----

TABLE = Path(__file__).with_name("plan_table.json")
# registry keys Primus applies itself on top of a flavor (registry.py), and how they change the description
_OVERRIDES = ("n_layers", "vocab_size", "num_experts", "top_k", "load_balance_coeff")


@functools.cache
def plan_table() -> dict[str, Any]:
    return json.loads(TABLE.read_text(encoding="utf-8"))


def describe(params: dict[str, Any], world_size: int | None, device: str, fail) -> tuple[ModelSpec, Any] | None:
    """(ModelSpec, ParallelLayout) from the generated table, torch-free; None where only TorchTitan can tell
    (a model or a registry keyword the table does not cover: the caller asks the engine). ``fail(key,
    message)`` makes the ConfigError of a misspelt key in the sections the plan reads."""
    from primus.config.errors import did_you_mean

    table = plan_table()
    for section in ("training", "parallelism", "loss"):
        for key in params.get(section) or {}:
            if key not in table["sections"][section]:
                raise fail(f"{section}.{key}", f"unknown key for TorchTitan's {section} config"
                                               f"{did_you_mean(key, table['sections'][section])}")
    mode = (params.get("activation_checkpoint") or {}).get("mode", "selective")
    if mode not in table["sections"]["activation_checkpoint_modes"]:
        modes = table["sections"]["activation_checkpoint_modes"]
        raise fail("activation_checkpoint.mode", f"'{mode}' is not one of {', '.join(modes)}{did_you_mean(str(mode), modes)}")
    model = _table_model(params.get("model"), table, fail)
    if model is None:
        return None
    return model, parallel_layout(params, world_size, model.n_layers, device)


def _table_model(block: Any, table: dict[str, Any], fail) -> ModelSpec | None:
    from primus.backends.torchtitan.registry import RegistryModel, _suggest, is_registry_model
    from primus.config.errors import did_you_mean

    if not isinstance(block, dict) or "converters" in block:
        return None  # the engine path says what is wrong, and applies a float8 converter (config.py)
    if not is_registry_model(block):
        return ModelSpec(**block)
    models = table["models"]
    name, flavor = block.get("name"), str(block.get("flavor"))
    if name not in models:
        if name == "llama4" or name is None:
            return None  # llama4: transformers' model (llama4.py); no name: the engine path says so
        raise fail("model.name", f"'{name}' is not a TorchTitan model{did_you_mean(str(name), models)}; "
                                 f"known: {', '.join(sorted(models))}")
    entry = models[name]
    if flavor not in entry["flavors"]:
        if flavor in entry["not_planned"] or "*" in entry["not_planned"]:
            return None
        raise fail("model.flavor", f"'{flavor}' is not a flavor of TorchTitan's {name}"
                                   f"{_suggest(flavor, entry['flavors'])}; known: {', '.join(entry['flavors'])}")
    extra = set(block) - {"name", "flavor", *_OVERRIDES}
    if extra:
        return None  # another model_registry keyword: what it changes, TorchTitan knows
    given = RegistryModel(**block)
    fields = dict(entry["flavors"][flavor])
    if given.n_layers is not None:
        layers = fields["n_layers"]
        if given.n_layers > layers:
            raise fail("model.n_layers", f"{given.n_layers} is more than the {layers} layers of {name} {flavor} "
                                         "(n_layers keeps the first n)")
        fields["n_layers"] = given.n_layers
        if isinstance(fields.get("moe_layer_freq"), list):
            fields["moe_layer_freq"] = fields["moe_layer_freq"][:given.n_layers]
    if given.vocab_size is not None:
        fields["vocab_size"] = given.vocab_size
    for key, target in (("num_experts", "n_experts"), ("top_k", "top_k")):
        if getattr(given, key) is not None:
            if not fields.get("n_experts"):
                raise fail(f"model.{key}", f"{name} {flavor} has no MoE layers")
            fields[target] = getattr(given, key)
    return ModelSpec(**fields)
