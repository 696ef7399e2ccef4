"""Model FLOPs, one convention for every backend, so TFLOP/s and MFU compare across engines.

The convention is Megatron-LM's ``num_floating_point_operations`` (``transformer_flops``,
megatron/training/training.py at d3528a2, the commit AMD Primus pins), per token of one training
step (forward + backward = 3 x forward; a multiply-add = 2 FLOPs)::

    flops_per_token = 6 * ( h * [ ffn * f * n_dense                       MLP of the dense layers
                                  + (moe_ffn * top_k + shared_ffn) * f * n_moe ]   routed + shared experts
                            + attention * n_layers
                            + mtp * (3h + 2h^2)                            MTP norms and projection
                            + h * V * (mtp + 1) )                          logits (head counted even when tied)

``f`` = 3 for SwiGLU (2 otherwise); ``n_dense``/``n_moe`` count the MTP layers too (an MTP layer
is the kind of the last decoder layer), ``n_layers`` = decoder + MTP layers, ``V`` the padded
vocabulary. Attention, per layer, with ``q = n_heads * head_dim``, ``kv = kv_heads * head_dim``::

    GQA/MHA:  h * (q + 2 kv) + q * h          + q * s                  (QK^T and AV, causal: / 2 each)
    MLA:      q_term + r_kv * (h + n (d_nope + d_v) + 1) + h * d_rope + n * d_v * h
              + s * n * (d_nope + d_rope) / 2 + s * n * d_v / 2
              q_term = h * n * (d_nope + d_rope), or with a query LoRA r_q * (h + n (d_nope + d_rope) + 1)

(the ``+ 1`` are Megatron-LM's count of the latent norms). Routers and norms are not counted.
For a dense model with ``n_heads * head_dim == dim`` this is ``6 * N_matmul + 6 * L * s * dim``
(``ModelSpec.matmul_params``), the formula every backend used before MoE. ``causal=False`` drops the
halving of the attention scores (PaLM's appendix B convention), for comparison only.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from primus.plan.model import ModelSpec

FORWARD_BACKWARD = 3  # forward, weight-gradient and data-gradient GEMMs
FMA = 2  # a multiply-add is two floating-point operations


def attention_flops_per_token(model: "ModelSpec", seq_len: int, causal: bool = True) -> float:
    """Forward multiply-adds of one attention layer per token (Megatron-LM's ``standard_self_attn_term``
    without the 3 x 2 factor)."""
    h, n, s = model.dim, model.n_heads, seq_len
    mask = 2 if causal else 1  # a causal mask leaves half of the scores
    if model.is_mla:
        nope, rope, v, r_kv = model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim, model.kv_lora_rank
        if model.q_lora_rank is None:
            q_term = h * n * (nope + rope)
        else:
            q_term = model.q_lora_rank * (h + n * (nope + rope) + 1)
        return (q_term + r_kv * (h + n * (nope + v) + 1) + h * rope + n * v * h
                + s * n * (nope + rope) / mask + s * n * v / mask)
    q, kv = n * model.head_dim, model.kv_heads * model.head_dim
    return h * (q + 2 * kv) + q * s / mask * 2 + q * h


def flops_per_token(model: "ModelSpec", seq_len: int, *, causal: bool = True) -> float:
    """Training FLOPs per token (Megatron-LM's ``num_floating_point_operations`` / tokens; module docstring)."""
    h = model.dim
    gated = 3 if model.swiglu else 2
    pattern = model.moe_layer_pattern()
    mtp = model.mtp_layers
    n_moe = sum(pattern) + (mtp if model.mtp_layer_is_moe else 0)
    n_dense = model.n_layers + mtp - n_moe
    mlp = h * (model.ffn_dim * gated * n_dense
               + (model.expert_ffn_dim * model.top_k + model.shared_expert_ffn_hidden_size) * gated * n_moe)
    attention = attention_flops_per_token(model, seq_len, causal) * (model.n_layers + mtp)
    mtp_terms = mtp * (3 * h + 2 * h * h)
    logits = h * model.vocab_size * (mtp + 1)
    return FORWARD_BACKWARD * FMA * (mlp + attention + mtp_terms + logits)


def dense_decoder_flops_per_token(
    *, n_layers: int, dim: int, seq_len: int, matmul_params: int, causal: bool = True
) -> float:
    """``flops_per_token`` of a dense decoder whose heads span ``dim``, from its matmul parameters
    (``ModelSpec.matmul_params``): ``6 * N_matmul + 6 * L * s * dim`` (causal)."""
    attention = 12 * n_layers * seq_len * dim
    return 6 * matmul_params + (attention / 2 if causal else attention)

