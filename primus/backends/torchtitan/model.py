"""Neutral ``ModelSpec`` -> TorchTitan's own ``ModelSpec`` (llama3 family).

Built from TorchTitan's public config classes the same way its registry builds its
flavors (``torchtitan.models.llama3.model_registry``), with the same initialisers; only the
shape comes from our preset and the attention implementation from ``attn_backend``.
"""
from __future__ import annotations

from functools import partial

from primus.plan.model import ModelSpec

ATTENTION_BACKENDS = ("sdpa", "flex", "flex_flash", "varlen")


def _inner_attention(backend: str):
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.config_utils import get_attention_config

    if backend == "sdpa":
        # Causal SDPA (no per-document masking). TorchTitan's registry no longer offers it
        # for LMs, but FlexAttention has no CPU backward in torch 2.13, so CPU runs need it.
        return ScaledDotProductAttention.Config()
    return get_attention_config(backend)


def build_model_spec(spec: ModelSpec, attn_backend: str):
    import torch.nn as nn
    from torchtitan.distributed.pipeline_parallel import pipeline_llm
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config
    from torchtitan.models.common.param_init import depth_scaled_std
    from torchtitan.models.llama3 import Llama3StateDictAdapter, parallelize_llama
    from torchtitan.models.llama3.model import Llama3Model, Llama3TransformerBlock
    from torchtitan.protocols.model_spec import ModelSpec as TitanModelSpec

    # TorchTitan's llama3 embedding init is N(0, 1); the neutral key may ask for another std.
    embedding_std = 1.0 if spec.embedding_init_std is None else spec.embedding_init_std
    linear_init = {"weight": partial(nn.init.trunc_normal_, std=0.02), "bias": nn.init.zeros_}
    norm_init = {"weight": nn.init.ones_}
    out_std = spec.dim ** -0.5
    output_init = {"weight": partial(nn.init.trunc_normal_, std=out_std, a=-3 * out_std, b=3 * out_std),
                   "bias": nn.init.zeros_}

    def depth_init(layer_id: int) -> dict:
        return {"weight": partial(nn.init.trunc_normal_, std=depth_scaled_std(0.02, layer_id)), "bias": nn.init.zeros_}

    def norm() -> RMSNorm.Config:
        return RMSNorm.Config(normalized_shape=spec.dim, eps=spec.norm_eps, param_init=norm_init)

    rope = ComplexRoPE.Config(dim=spec.head_dim, max_seq_len=spec.max_seq_len, theta=spec.rope_theta,
                              scaling=spec.rope_scaling or "none")
    layers = [
        Llama3TransformerBlock.Config(
            attention_norm=norm(),
            ffn_norm=norm(),
            attention=make_gqa_config(
                dim=spec.dim, n_heads=spec.n_heads, n_kv_heads=spec.n_kv_heads, wqkv_param_init=linear_init,
                wo_param_init=depth_init(layer_id), inner_attention=_inner_attention(attn_backend), rope=rope,
                fuse_qkv=True,
            ),
            feed_forward=make_ffn_config(dim=spec.dim, hidden_dim=spec.ffn_dim, w1_param_init=linear_init,
                                         w2w3_param_init=depth_init(layer_id)),
        )
        for layer_id in range(spec.n_layers)
    ]
    model = Llama3Model.Config(
        dim=spec.dim,
        vocab_size=spec.vocab_size,
        tok_embeddings=Embedding.Config(num_embeddings=spec.vocab_size, embedding_dim=spec.dim,
                                        param_init={"weight": partial(nn.init.normal_, std=embedding_std)}),
        norm=norm(),
        lm_head=Linear.Config(in_features=spec.dim, out_features=spec.vocab_size, param_init=output_init),
        layers=layers,
        enable_weight_tying=spec.tie_embeddings,
    )
    return TitanModelSpec(name="llama3", flavor=spec.family, model=model, parallelize_fn=parallelize_llama,
                     pipelining_fn=pipeline_llm, post_optimizer_build_fn=None,
                     state_dict_adapter=Llama3StateDictAdapter)
