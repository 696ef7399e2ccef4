"""DeepSeek-style models on megatron-core: multi-latent attention with YaRN RoPE, MoE with a shared
expert, sigmoid group-limited routing with expert bias, and multi-token prediction."""
from __future__ import annotations

import math

import pytest

from primus.backends.megatron.arguments import parse_args
from tests.backends.megatron.conftest import run_megatron

pytest.importorskip("megatron.core")

DEEPSEEK_TINY = {
    "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 128, "swiglu": True,
    "normalization": "RMSNorm", "position_embedding_type": "rope", "add_bias_linear": False, "vocab_size": 512,
    "max_position_embeddings": 128, "untie_embeddings_and_output_weights": True, "hidden_dropout": 0.0,
    "attention_dropout": 0.0, "qk_layernorm": True,
    # MLA (DeepSeek-V3's shape, shrunk) with YaRN
    "multi_latent_attention": True, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_head_dim": 16,
    "qk_pos_emb_head_dim": 8, "v_head_dim": 16, "rope_type": "yarn", "rotary_scaling_factor": 4.0,
    "mscale": 1.0, "mscale_all_dim": 1.0,
    # MoE: a dense first layer, then experts (AMD's preset pattern syntax), one shared expert
    "num_experts": 4, "moe_layer_freq": "([0]*1+[1]*1)", "moe_router_topk": 2, "moe_ffn_hidden_size": 64,
    "moe_shared_expert_intermediate_size": 64, "moe_router_score_function": "sigmoid",
    "moe_router_enable_expert_bias": True, "moe_router_num_groups": 2, "moe_router_group_topk": 1,
    "moe_router_topk_scaling_factor": 2.5, "moe_router_load_balancing_type": "seq_aux_loss",
    "moe_aux_loss_coeff": 1e-3, "moe_router_dtype": "fp32",
    "mtp_num_layers": 1,
    "seq_length": 64, "micro_batch_size": 2, "global_batch_size": 4, "train_iters": 6, "lr": 3e-3,
    "lr_warmup_iters": 1, "eval_interval": None, "seed": 1234,
}


def test_mla_yarn_and_mtp_reach_megatron_cores_config():
    from primus.backends.megatron.model import Derived, transformer_config

    config = transformer_config(parse_args({**DEEPSEEK_TINY, "mock_data": True}), on_gpu=False, derived=Derived())
    assert type(config).__name__ == "MLATransformerConfig"
    assert (config.q_lora_rank, config.kv_lora_rank, config.qk_head_dim, config.qk_pos_emb_head_dim,
            config.v_head_dim) == (32, 16, 16, 8, 16)
    assert (config.rope_type, config.rotary_scaling_factor, config.mscale, config.mscale_all_dim) == ("yarn", 4.0, 1.0, 1.0)
    assert config.moe_layer_freq == [0, 1] and config.num_moe_experts == 4 and config.mtp_num_layers == 1
    assert config.moe_router_score_function == "sigmoid" and config.moe_router_enable_expert_bias
    assert config.moe_shared_expert_intermediate_size == 64 and config.moe_router_group_topk == 1


@pytest.mark.e2e
def test_deepseek_style_model_trains_on_cpu(tmp_path, tiny_assets, tiny_indexed):
    params = {**DEEPSEEK_TINY, "tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": str(tiny_assets["tokenizer"]),
              "data_path": [str(tiny_indexed)], "split": "98,2,0"}
    records = run_megatron(tmp_path / "deepseek_tiny", params, nproc=1)
    assert [r["step"] for r in records] == list(range(1, 7))
    assert all(math.isfinite(r["loss"]) for r in records)
    assert records[-1]["loss"] < records[0]["loss"] - 0.5
    extras = records[-1]["extra"]
    assert set(extras) == {"seq_load_balancing_loss", "mtp_1 loss"}  # router and MTP losses, every step
    assert all(0 < r["extra"]["mtp_1 loss"] < 10 for r in records)
