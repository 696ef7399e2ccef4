"""Hugging Face tensors <-> megatron-core's checkpoint layout, for any TP / PP / (V)PP / EP layout.

megatron-core describes every local parameter in ``sharded_state_dict()``: a key that does not
depend on the layout (``decoder.layers.self_attention.linear_qkv.weight``), the global shape
with the layer (and expert) axes prepended, and this rank's offset in it. Loading is therefore
one rule per key from HF tensors to the *global* megatron tensor of one layer, from which each
rank copies its own slice into the parameter itself. The same keys are what a ``torch_dist``
checkpoint stores, so export is the inverse rule over the full tensors.

Layouts (megatron-core, with Transformer Engine's names which the local spec also uses):
  * ``linear_qkv``: per query group, its query heads then one key and one value head
    (``[groups, heads/groups + 2, head_dim, hidden]``); biases the same way;
  * ``linear_fc1``: gate rows then up rows (SwiGLU);
  * embedding / output layer: vocabulary rows padded to Megatron's multiple with zeros.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from primus.config.errors import ConfigError
from primus.plan.model import ModelSpec

LAYER = "decoder.layers."


def _qkv(q, k, v, spec: ModelSpec):
    groups, per_group = spec.kv_heads, spec.n_heads // spec.kv_heads
    tail = q.shape[1:]
    q = q.reshape(groups, per_group * spec.head_dim, *tail)
    k = k.reshape(groups, spec.head_dim, *tail)
    v = v.reshape(groups, spec.head_dim, *tail)
    import torch

    return torch.cat([q, k, v], dim=1).reshape(-1, *tail)


def _split_qkv(qkv, spec: ModelSpec):
    groups, per_group, hd = spec.kv_heads, spec.n_heads // spec.kv_heads, spec.head_dim
    tail = qkv.shape[1:]
    grouped = qkv.reshape(groups, (per_group + 2) * hd, *tail)
    q, k, v = grouped.split([per_group * hd, hd, hd], dim=1)
    return q.reshape(-1, *tail), k.reshape(-1, *tail), v.reshape(-1, *tail)


def _layer_rules(spec: ModelSpec) -> dict[str, tuple[list[str], Callable, Callable]]:
    """megatron key (without ``decoder.layers.``) -> (HF names under ``model.layers.{i}.``,
    hf tensors -> megatron tensor, megatron tensor -> hf tensors)."""
    import torch

    one = (lambda t: t), (lambda t: [t])
    attn = "self_attn."
    rules = {
        "self_attention.linear_qkv.layer_norm_weight": (["input_layernorm.weight"], *one),
        "self_attention.linear_qkv.weight": ([attn + "q_proj.weight", attn + "k_proj.weight", attn + "v_proj.weight"],
                                             lambda q, k, v: _qkv(q, k, v, spec), lambda t: list(_split_qkv(t, spec))),
        "self_attention.linear_proj.weight": ([attn + "o_proj.weight"], *one),
    }
    if spec.qkv_bias:
        rules["self_attention.linear_qkv.bias"] = (
            [attn + "q_proj.bias", attn + "k_proj.bias", attn + "v_proj.bias"],
            lambda q, k, v: _qkv(q, k, v, spec), lambda t: list(_split_qkv(t, spec)))
    if spec.qk_norm:
        rules["self_attention.q_layernorm.weight"] = ([attn + "q_norm.weight"], *one)
        rules["self_attention.k_layernorm.weight"] = ([attn + "k_norm.weight"], *one)
    # the norm before the MLP: fused into fc1 with Transformer Engine; the local spec keeps the fused name
    # in its checkpoint for dense and MoE layers alike
    rules["mlp.linear_fc1.layer_norm_weight"] = (["post_attention_layernorm.weight"], *one)
    if spec.is_moe:
        rules["pre_mlp_layernorm.weight"] = (["post_attention_layernorm.weight"], *one)
        rules["mlp.router.weight"] = (["block_sparse_moe.gate.weight"], *one)
    else:
        rules["mlp.linear_fc1.weight"] = (["mlp.gate_proj.weight", "mlp.up_proj.weight"],
                                          lambda g, u: torch.cat([g, u]), lambda t: list(t.chunk(2)))
        rules["mlp.linear_fc2.weight"] = (["mlp.down_proj.weight"], *one)
    return rules


def _expert_rules() -> dict[str, tuple[list[str], Callable, Callable]]:
    """Per-expert keys (megatron-core SequentialMLP / grouped experts), HF under ``block_sparse_moe.experts.{e}.``."""
    import torch

    fc1 = (["w1.weight", "w3.weight"], lambda g, u: torch.cat([g, u]), lambda t: list(t.chunk(2)))
    fc2 = (["w2.weight"], lambda t: t, lambda t: [t])
    return {"linear_fc1.weight": fc1, "linear_fc2.weight": fc2}


_EXPERT_KEY = re.compile(r"^mlp\.experts\.(?:experts|local_experts)\.(linear_fc[12]\.weight)$")


class MegatronHFMapping:
    """The rules for one model: megatron global tensors from HF tensors and back."""

    def __init__(self, spec: ModelSpec):
        self.spec = spec
        self.layer_rules = _layer_rules(spec)
        self.expert_rules = _expert_rules() if spec.is_moe else {}

    # -- HF -> megatron ------------------------------------------------------------------------
    def sources(self, key: str, index: tuple[int, ...]) -> tuple[list[str], Callable]:
        """HF tensor names and the function combining them into megatron's ``key`` at ``index``."""
        if key == "embedding.word_embeddings.weight":
            return ["model.embed_tokens.weight"], lambda t: t
        if key == "output_layer.weight":
            name = "model.embed_tokens.weight" if self.spec.tie_embeddings else "lm_head.weight"
            return [name], lambda t: t
        if key == "decoder.final_layernorm.weight":
            return ["model.norm.weight"], lambda t: t
        if key.startswith(LAYER):
            local, layer = key[len(LAYER):], index[0]
            expert = _EXPERT_KEY.match(local)
            if expert and expert.group(1) in self.expert_rules:
                names, combine, _ = self.expert_rules[expert.group(1)]
                return [f"model.layers.{layer}.block_sparse_moe.experts.{index[1]}.{n}" for n in names], combine
            if local in self.layer_rules:
                names, combine, _ = self.layer_rules[local]
                return [f"model.layers.{layer}.{n}" for n in names], combine
        raise ConfigError(f"hf_path: megatron-core parameter {key} has no Hugging Face counterpart for a "
                          f"{self.spec.family} model (unsupported architecture option)")

    # -- megatron -> HF ------------------------------------------------------------------------
    def to_hf(self, key: str, full) -> dict[str, Any]:
        """HF tensors from one full megatron tensor (layer/expert axes first), vocabulary unpadded."""
        spec = self.spec
        if key in ("embedding.word_embeddings.weight", "output_layer.weight"):
            if key == "output_layer.weight" and spec.tie_embeddings:
                return {}
            name = "model.embed_tokens.weight" if key.startswith("embedding") else "lm_head.weight"
            return {name: full[: spec.vocab_size]}
        if key == "decoder.final_layernorm.weight":
            return {"model.norm.weight": full}
        if not key.startswith(LAYER):
            return {}
        local = key[len(LAYER):]
        out = {}
        expert = _EXPERT_KEY.match(local)
        if expert and expert.group(1) in self.expert_rules:
            names, _, split = self.expert_rules[expert.group(1)]
            for layer in range(full.shape[0]):
                for e in range(full.shape[1]):
                    for name, tensor in zip(names, split(full[layer, e])):
                        out[f"model.layers.{layer}.block_sparse_moe.experts.{e}.{name}"] = tensor
            return out
        if local not in self.layer_rules:
            return {}
        names, _, split = self.layer_rules[local]
        for layer in range(full.shape[0]):
            for name, tensor in zip(names, split(full[layer])):
                out[f"model.layers.{layer}.{name}"] = tensor
        return out


def _sharded_tensors(chunk, metadata: dict) -> list:
    """Every ShardedTensor of a GPTModel chunk, factories (SwiGLU fc1) expanded into their parts."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    found = []
    for value in nested_values(chunk.sharded_state_dict(prefix="", metadata=metadata)):
        if isinstance(value, ShardedTensorFactory):
            built = value.build()
            found += [t for t in nested_values(built) if isinstance(t, ShardedTensor)] if isinstance(built, (list, dict)) \
                else [built]
        elif isinstance(value, ShardedTensor):
            found.append(value)
    return found


def load_hf_into_megatron(chunks: list, checkpoint, spec: ModelSpec, metadata: dict | None = None) -> int:
    """Copy this rank's slice of every parameter from ``checkpoint`` (an ``HFCheckpoint``) into the
    unwrapped GPTModel ``chunks``; returns the number of tensors filled. A shape mismatch is one
    ConfigError naming the HF tensor(s) and both shapes."""
    import torch

    mapping = MegatronHFMapping(spec)
    metadata = metadata if metadata is not None else {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
    cache: tuple[tuple, Any] | None = None
    filled = 0
    with torch.no_grad():
        for chunk in chunks:
            for sharded in _sharded_tensors(chunk, metadata):
                prepend = sharded.prepend_axis_num
                index = tuple(sharded.global_offset[:prepend])
                names, combine = mapping.sources(sharded.key, index)
                if cache is None or cache[0] != (sharded.key, index):
                    cache = ((sharded.key, index), combine(*(checkpoint.tensor(n) for n in names)))
                full = cache[1]
                expected = tuple(sharded.global_shape[prepend:])
                if full.shape[0] < expected[0] and sharded.key in ("embedding.word_embeddings.weight", "output_layer.weight") \
                        and tuple(full.shape[1:]) == expected[1:]:
                    full = torch.cat([full, full.new_zeros(expected[0] - full.shape[0], *full.shape[1:])])
                    cache = (cache[0], full)  # Megatron pads the vocabulary to a multiple: zero rows
                if tuple(full.shape) != expected:
                    shown = ", ".join(f"{n} {tuple(checkpoint.shape(n))}" for n in names)
                    raise ConfigError(f"hf_path: {shown} -> megatron-core {sharded.key} has shape {tuple(full.shape)}, "
                                      f"the model expects {expected}")
                offset = sharded.global_offset[prepend:]
                piece = full[tuple(slice(o, o + n) for o, n in zip(offset, sharded.local_shape))]
                sharded.data.copy_(piece.to(sharded.data.dtype))
                filled += 1
    return filled


def megatron_to_hf(tensors: dict[str, Any], spec: ModelSpec) -> dict[str, Any]:
    """HF state dict from full megatron tensors (as ``load_plain_tensors`` reads a torch_dist checkpoint)."""
    mapping = MegatronHFMapping(spec)
    out: dict[str, Any] = {}
    for key, full in tensors.items():
        out.update(mapping.to_hf(key, full))
    return out
