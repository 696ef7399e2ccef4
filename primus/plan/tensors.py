"""The parameter tensors one rank holds, by name and local shape, as each engine builds and splits them.

Megatron (``memory_model`` megatron / megatron-te) registers a layer's parameters in the order of
megatron-core's modules (input norm, output projection, fused QKV, Q/K norms, pre-MLP norm, fused fc1,
fc2; MoE: router, each local expert's fc1/fc2, shared experts); its gradient buffers follow that order
(reversed), so the padding between parameters does too. TorchTitan keeps w1/w3 apart and its routed
experts as three [experts, ...] tensors; FSDP2 shards each tensor's first dimension. Tensor parallelism
splits what megatron-core and TorchTitan both split (attention heads, MLP width, vocabulary); expert
parallelism splits the routed experts, expert tensor parallelism each expert.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from primus.plan.layout import ParallelLayout
from primus.plan.model import ModelSpec


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]  # on this rank, after the tensor- and expert-parallel splits
    expert: bool = False  # a routed expert's weight (sharded over the expert-data-parallel group)
    shared_embedding: bool = False  # Megatron: a tied embedding on a pipeline stage (a bucket of its own)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def rows(self) -> int:
        return self.shape[0]


def _norm(model: ModelSpec, name: str, width: int) -> list[Tensor]:
    out = [Tensor(f"{name}.weight", (width,))]
    return out + [Tensor(f"{name}.bias", (width,))] if model.normalization == "layernorm" else out


def _attention(model: ModelSpec, t: int, titan: bool) -> list[Tensor]:
    h, n = model.dim, model.n_heads
    bias = model.linear_bias
    if model.is_mla:
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        kv_down = model.kv_lora_rank + model.qk_rope_head_dim
        out = []
        if model.q_lora_rank is None:
            out.append(Tensor("q_proj.weight", (n * qk // t, h)))
        else:
            out += [Tensor("q_down_proj.weight", (model.q_lora_rank, h))]
            out += _norm(model, "q_layernorm", model.q_lora_rank) if model.qk_norm else []
            out.append(Tensor("q_up_proj.weight", (n * qk // t, model.q_lora_rank)))
        out.append(Tensor("kv_down_proj.weight", (kv_down, h)))
        out += _norm(model, "kv_layernorm", model.kv_lora_rank) if model.qk_norm else []
        out.append(Tensor("kv_up_proj.weight", (n * (model.qk_nope_head_dim + model.v_head_dim) // t,
                                                 model.kv_lora_rank)))
        out.append(Tensor("proj.weight", (h, n * model.v_head_dim // t)))
        return out + ([Tensor("proj.bias", (h,))] if bias else [])
    d, g = model.head_dim, model.kv_heads
    qkv = (n + 2 * g) * d // t
    proj = [Tensor("linear_proj.weight", (h, n * d // t))] + ([Tensor("linear_proj.bias", (h,))] if bias else [])
    fused = [Tensor("linear_qkv.weight", (qkv, h))] + (
        [Tensor("linear_qkv.bias", (qkv,))] if model.qkv_bias or bias else [])
    norms = _norm(model, "q_layernorm", d) + _norm(model, "k_layernorm", d) if model.qk_norm else []
    return fused + norms + proj if titan else proj + fused + norms


def _mlp(model: ModelSpec, width: int, split: int, titan: bool, prefix: str = "mlp", expert: bool = False) -> list[Tensor]:
    """One MLP of ``width`` split ``split`` ways: Megatron's fused fc1 (gate and up) and fc2, TorchTitan's w1, w3, w2."""
    h, w = model.dim, width // split
    gated = model.swiglu
    bias = model.linear_bias
    if titan:
        out = [Tensor(f"{prefix}.w1.weight", (w, h), expert), Tensor(f"{prefix}.w2.weight", (h, w), expert)]
        return out + ([Tensor(f"{prefix}.w3.weight", (w, h), expert)] if gated else [])
    fc1 = (2 if gated else 1) * w
    out = [Tensor(f"{prefix}.linear_fc1.weight", (fc1, h), expert)]
    out += [Tensor(f"{prefix}.linear_fc1.bias", (fc1,), expert)] if bias else []
    out.append(Tensor(f"{prefix}.linear_fc2.weight", (h, w), expert))
    return out + ([Tensor(f"{prefix}.linear_fc2.bias", (h,), expert)] if bias else [])


def _moe(model: ModelSpec, layout: ParallelLayout, titan: bool) -> list[Tensor]:
    h, local = model.dim, model.n_experts // layout.ep
    width = model.expert_ffn_dim // layout.expert_tp
    out = [Tensor("router.weight", (model.n_experts, h))]
    if titan:  # GroupedExperts: [experts, out, in]
        out += [Tensor("experts.w1", (local, width, h), True), Tensor("experts.w2", (local, h, width), True),
                Tensor("experts.w3", (local, width, h), True)]
    else:
        for i in range(local):
            out += _mlp(model, model.expert_ffn_dim, layout.expert_tp, False, f"experts.{i}", expert=True)
    if model.shared_expert_ffn_hidden_size:
        out += _mlp(model, model.shared_expert_ffn_hidden_size, layout.tp, titan, "shared_experts")
    return out


def layer_tensors(model: ModelSpec, layout: ParallelLayout, moe: bool) -> list[Tensor]:
    """One decoder layer's parameters on a rank, in the order the engine registers them."""
    titan = layout.memory_model == "torchtitan"
    mlp = _moe(model, layout, titan) if moe else _mlp(model, model.ffn_dim, layout.tp, titan)
    return (_norm(model, "input_layernorm", model.dim) + _attention(model, layout.tp, titan)
            + _norm(model, "pre_mlp_layernorm", model.dim) + mlp)


def _mtp_layer(model: ModelSpec, layout: ParallelLayout) -> list[Tensor]:
    h = model.dim
    return (_norm(model, "mtp.enorm", h) + _norm(model, "mtp.hnorm", h)
            + [Tensor("mtp.eh_proj.weight", (2 * h // layout.tp, h))]  # megatron splits it column-wise
            + layer_tensors(model, layout, model.mtp_layer_is_moe) + _norm(model, "mtp.final_layernorm", h))


def chunk_tensors(model: ModelSpec, layout: ParallelLayout, pp_rank: int, chunk: int) -> list[Tensor]:
    """The parameters of one model chunk (a virtual pipeline stage) on pipeline rank ``pp_rank``."""
    placement = layout.chunk_placement(model.n_layers)[pp_rank][chunk]
    pattern = model.moe_layer_pattern()
    vocab = model.vocab_size // layout.tp if model.vocab_size % layout.tp == 0 else -(-model.vocab_size // layout.tp)
    first, last = placement.embedding, placement.loss
    out: list[Tensor] = []
    if first:
        out.append(Tensor("embedding.weight", (vocab, model.dim)))
    for i in placement.layers:
        out += layer_tensors(model, layout, bool(pattern[i]))
    if last:
        out += _norm(model, "final_layernorm", model.dim)
        tied = model.tie_embeddings
        if not tied or not first:  # a tied head on another stage than the embedding is a second copy
            out.append(Tensor("output_layer.weight", (vocab, model.dim), shared_embedding=tied))
        for _ in range(model.mtp_layers):
            out += _mtp_layer(model, layout)
    if first and model.tie_embeddings and not last and layout.pp > 1:
        out[0] = Tensor("embedding.weight", (vocab, model.dim), shared_embedding=True)
    return out
