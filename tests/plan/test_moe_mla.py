"""Plan math for MoE, MLA and MTP: hand-computed small cases, and Megatron-LM's own formulas (read from the
mirror) on the same arguments."""
from __future__ import annotations

import pytest

from primus.backends.megatron.plan import model_from_args, resolved_args
from primus.cli.plan_report import run_plan
from primus.plan.estimate import estimate_memory, estimate_params
from primus.plan.flops import dense_decoder_flops_per_token, flops_per_token
from primus.plan.layout import ParallelLayout, check_layout
from primus.plan.model import ModelSpec

from tests.plan.megatron_lm_reference import (as_megatron_namespace, megatron_flops_per_token,
                                               megatron_param_count, mirror_available)

# 2 layers, the second MoE: 4 experts of width 6, top-2, a shared expert of width 4.
MOE = dict(n_layers=2, dim=8, n_heads=2, n_kv_heads=1, ffn_hidden_size=16, vocab_size=10,
           n_experts=4, top_k=2, moe_ffn_hidden_size=6, shared_expert_ffn_hidden_size=4, moe_layer_freq=[0, 1])
# 1 MLA layer: query LoRA 4, KV LoRA 3, 2 heads of (2 + 1 rope) for Q/K and 2 for V, latent norms, tied.
MLA = dict(n_layers=1, dim=8, n_heads=2, ffn_hidden_size=16, vocab_size=10, tie_embeddings=True, q_lora_rank=4,
           kv_lora_rank=3, qk_nope_head_dim=2, qk_rope_head_dim=1, v_head_dim=2, qk_norm=True)


def test_moe_parameters_by_hand():
    model = ModelSpec(**MOE)
    attention = 8 * (8 + 2 * 4) + 8 * 8  # wq + wk + wv (1 group of 4), wo
    expert, shared, router = 3 * 8 * 6, 3 * 8 * 4, 4 * 8
    total = 80 + 80 + 2 * attention + (2 * 2 + 1) * 8 + 3 * 8 * 16 + 4 * expert + shared + router
    assert total == 1672 and model.total_params() == total
    assert model.active_params() == total - 2 * expert == 1384  # 2 of the 4 experts
    assert model.param_counts().megatron_counted == total - router  # Megatron-LM leaves the router out
    assert model.moe_layer_pattern() == [0, 1]
    assert ModelSpec(**{**MOE, "moe_layer_freq": 2}).moe_layer_pattern() == [1, 0]  # every 2nd from layer 0


def test_moe_flops_by_hand():
    model = ModelSpec(**MOE)
    mlp = 8 * (16 * 3 * 1 + (6 * 2 + 4) * 3 * 1)  # dense layer + (top-2 routed + shared) in the MoE layer
    attention = 8 * (8 + 2 * 4) + 8 * 16 + 8 * 8  # projections + causal scores (q * s) + output
    assert flops_per_token(model, 16) == 6 * (mlp + 2 * attention + 8 * 10) == 8928
    assert flops_per_token(model, 16, causal=False) == 8928 + 6 * 2 * 8 * 16


def test_mla_parameters_and_flops_by_hand():
    model = ModelSpec(**MLA)
    q = 8 * 4 + 4 + 4 * 2 * 3  # down-projection, latent norm, up-projection to 2 heads x (2 + 1)
    kv = 8 * (3 + 1) + 3 + 3 * 2 * (2 + 2)  # down (latent + shared rope key), norm, up to K_nope + V
    attention = q + kv + 2 * 2 * 8
    assert attention == 151 and model.param_counts().attention == 151
    assert model.total_params() == 80 + attention + 3 * 8 * 16 + 3 * 8  # tied head, 3 norms
    # Megatron-LM counts each latent norm as a (q_lora_rank x 1) matmul: the "+ 1" terms
    scores = 6 * 2 * 3 / 2 + 6 * 2 * 2 / 2
    flops_attention = 4 * (8 + 2 * 3 + 1) + 3 * (8 + 2 * 4 + 1) + 8 * 1 + 2 * 2 * 8 + scores
    assert flops_per_token(model, 6) == 6 * (flops_attention + 3 * 8 * 16 + 8 * 10) == 3870


def test_mtp_layer_repeats_the_last_layer_kind():
    with_mtp = ModelSpec(**MOE, mtp_layers=1)
    plain = ModelSpec(**MOE)
    moe_layer = 192 + 16 + 4 * 144 + 96 + 32  # attention, 2 norms, experts, shared, router
    projection = 2 * 8 * 8 + 3 * 8  # eh_proj + enorm, hnorm, final norm
    assert with_mtp.total_params() == plain.total_params() + moe_layer + projection == 2736
    assert with_mtp.total_params(mtp=False) == plain.total_params()
    logits_and_layer = flops_per_token(with_mtp, 16) - flops_per_token(plain, 16)
    assert logits_and_layer == 6 * (8 * (6 * 2 + 4) * 3 + 320 + 3 * 8 + 2 * 64 + 8 * 10)


def test_dense_flops_unchanged():
    llama = ModelSpec(n_layers=32, dim=4096, n_heads=32, n_kv_heads=8, ffn_hidden_size=14336, vocab_size=128256)
    assert flops_per_token(llama, 8192) == dense_decoder_flops_per_token(
        n_layers=32, dim=4096, seq_len=8192, matmul_params=llama.matmul_params())


def test_parameters_per_rank_with_expert_parallelism():
    model = ModelSpec(**MOE)
    layout = ParallelLayout(dp=4, ep=2, sharding="optimizer")
    params = estimate_params(model, layout)
    dense_layer, moe_base, experts = 192 + 16 + 384, 192 + 16 + 32 + 96, 2 * 144  # 2 of 4 experts per rank
    assert params.per_rank == dense_layer + moe_base + experts + 80 + 8 + 80 == 1384
    assert params.per_rank_experts == 288
    assert layout.expert_dp == 2  # the 4 ranks hold 2 copies of each expert
    memory = estimate_memory(model, layout)
    assert memory.optimizer == (1384 - 288) * 12 // 4 + 288 * 12 // 2  # dense over dp, experts over dp / ep
    assert memory.weights == 1384 * 2 and memory.grads == 1384 * 4
    etp = estimate_params(model, ParallelLayout(tp=2, dp=2, ep=2, etp=1))
    assert etp.per_rank_experts == 2 * 144  # experts whole (etp=1) though attention is split by tp=2
    assert estimate_params(model, ParallelLayout(tp=2, dp=2, ep=2)).per_rank_experts == 2 * 72  # etp = tp


@pytest.mark.parametrize("layout, needle", [
    (ParallelLayout(dp=6, ep=3), "n_experts (4) is not divisible by ep (3)"),
    (ParallelLayout(dp=2, ep=4), "ep x etp (4 x 1 = 4) does not divide the tp x dp x cp ranks of a pipeline stage (1 x 2 x 1 = 2)"),
    (ParallelLayout(tp=4, dp=1, etp=4), "expert width (6) is not divisible by etp (4)"),
])
def test_expert_parallel_rules(layout, needle):
    found = [f.message for f in check_layout(ModelSpec(**{**MOE, "n_heads": 4, "n_kv_heads": 4}), layout)
             if f.level == "fail"]
    assert found == [needle]


def test_expert_parallelism_on_a_dense_model_fails():
    dense = ModelSpec(n_layers=2, dim=8, n_heads=2, ffn_hidden_size=16, vocab_size=10)
    assert [f.message for f in check_layout(dense, ParallelLayout(dp=2, ep=2))] == [
        "ep (2) > 1 on a dense model: expert parallelism needs experts (n_experts)"]
    assert check_layout(ModelSpec(**{**MOE, "n_kv_heads": 2}), ParallelLayout(tp=2, dp=2, ep=4, etp=1)) == []


def test_plan_prints_total_and_active_for_moe():
    text, code = run_plan(ModelSpec(**MOE, mtp_layers=1), ParallelLayout(dp=4, ep=2), None)
    assert code == 0
    assert text.splitlines()[0].startswith("parameters        2,736 total, 2,160 active per token")
    assert "in the multi-token-prediction layers (1,672 total, 1,384 active without them)" in text
    assert "routed-expert weights (ep=2, etp=1)" in text
    dense, _ = run_plan(ModelSpec(n_layers=2, dim=8, n_heads=2, ffn_hidden_size=16, vocab_size=10),
                        ParallelLayout(), None)
    assert "active" not in dense


# Megatron-LM argument sets covering each branch of its formulas.
CASES = {
    "gqa-swiglu-rmsnorm": dict(num_layers=4, hidden_size=64, num_attention_heads=8, group_query_attention=True,
                               num_query_groups=2, ffn_hidden_size=160, swiglu=True, normalization="RMSNorm",
                               untie_embeddings_and_output_weights=True, vocab_size=1000, add_bias_linear=False),
    "heads-wider-than-hidden": dict(num_layers=2, hidden_size=64, num_attention_heads=8, kv_channels=16,
                                    group_query_attention=True, num_query_groups=4, swiglu=True,
                                    normalization="RMSNorm", vocab_size=500, add_bias_linear=False),
    "gpt-layernorm-tied": dict(num_layers=3, hidden_size=48, num_attention_heads=4, vocab_size=300,
                               add_bias_linear=False),
    "moe-pattern-shared-mtp": dict(num_layers=4, hidden_size=64, num_attention_heads=4, swiglu=True,
                                   normalization="RMSNorm", ffn_hidden_size=128, num_experts=8, moe_router_topk=2,
                                   moe_ffn_hidden_size=32, moe_shared_expert_intermediate_size=64,
                                   moe_layer_freq="([0]*1+[1]*3)", mtp_num_layers=1, vocab_size=1000,
                                   untie_embeddings_and_output_weights=True, add_bias_linear=False),
    "moe-every-2nd": dict(num_layers=4, hidden_size=64, num_attention_heads=4, swiglu=True, normalization="RMSNorm",
                          num_experts=4, moe_layer_freq=2, vocab_size=1000, add_bias_linear=False),
    "mla-q-lora-mtp": dict(num_layers=3, hidden_size=64, num_attention_heads=4, multi_latent_attention=True,
                           q_lora_rank=24, kv_lora_rank=16, qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=8,
                           qk_layernorm=True, swiglu=True, normalization="RMSNorm", ffn_hidden_size=128,
                           num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32,
                           moe_shared_expert_intermediate_size=32, moe_layer_freq="([0]+[1]*2)", mtp_num_layers=1,
                           vocab_size=1000, untie_embeddings_and_output_weights=True, add_bias_linear=False),
    "mla-no-q-lora": dict(num_layers=2, hidden_size=64, num_attention_heads=4, multi_latent_attention=True,
                          kv_lora_rank=16, qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=8, qk_layernorm=True,
                          swiglu=True, normalization="RMSNorm", vocab_size=1000, add_bias_linear=False),
}


@pytest.mark.skipif(not mirror_available(), reason="Megatron-LM mirror not available (MEGATRON_LM_GIT_DIR)")
@pytest.mark.parametrize("name", sorted(CASES))
def test_flops_and_parameters_match_megatron_lm(name):
    args = {**CASES[name], "seq_length": 256}
    model = model_from_args(args)
    namespace = as_megatron_namespace(resolved_args(args))
    assert flops_per_token(model, 256) == pytest.approx(megatron_flops_per_token(namespace), rel=1e-12)
    assert model.param_counts().megatron_counted == round(megatron_param_count(namespace))
