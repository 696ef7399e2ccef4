"""Megatron-LM arguments -> (ModelSpec, ParallelLayout): defaults and derived values as Megatron-LM's
validate_args makes them, from a namespace, a mapping or our parsed arguments."""
from __future__ import annotations

import argparse

import pytest
import yaml

from primus.backends.megatron.plan import layout_from_args, model_from_args, moe_layer_pattern, plan_inputs, resolved_args
from primus.config.errors import ConfigError
from primus.config.presets import CONFIGS_ROOT
from primus.plan.model import ModelSpec

from tests.conftest import ROOT

GPT = dict(num_layers=2, hidden_size=96, num_attention_heads=6, vocab_size=50257, seq_length=128)


@pytest.mark.parametrize("value, expected", [
    (2, 2), ("3", 3), ("([0]*1+[1]*3)", [0, 1, 1, 1]), ("([1]*2+[0]*1)*2", [1, 1, 0, 1, 1, 0]), ([0, 1], [0, 1]),
])
def test_moe_layer_freq_as_megatron_lm_reads_it(value, expected):
    assert moe_layer_pattern(value, 4) == expected


@pytest.mark.parametrize("value", ["__import__('os')", "([0]*2", "one", True])
def test_bad_moe_layer_freq_is_one_line(value):
    with pytest.raises(ConfigError, match="moe_layer_freq") as error:
        moe_layer_pattern(value, 4)
    assert "\n" not in str(error.value)


def test_defaults_and_derived_values_follow_megatron_lm():
    a = resolved_args(GPT)
    assert a.kv_channels == 16 and a.ffn_hidden_size == 4 * 96  # GELU MLP: 4h
    assert a.num_query_groups == 6  # no GQA: one group per head
    assert a.padded_vocab_size == 50304  # a multiple of make_vocab_size_divisible_by (128)
    assert resolved_args({**GPT, "tensor_model_parallel_size": 2}).padded_vocab_size == 50432  # of 128 x TP
    assert resolved_args({**GPT, "swiglu": True}).ffn_hidden_size == 256  # int(4h * 2/3 / 64) * 64
    moe = resolved_args({**GPT, "num_experts": 4})
    assert moe.moe_ffn_hidden_size == moe.ffn_hidden_size and moe.moe_layer_freq == 1
    model = model_from_args(GPT)
    # Megatron-LM's defaults: LayerNorm, biases on every linear layer, tied embeddings, GELU
    assert (model.normalization, model.linear_bias, model.tie_embeddings, model.swiglu) == ("layernorm", True, True, False)
    assert model.vocab_size == 50304 and not model.is_moe


def test_namespace_and_mapping_agree_and_old_names_are_read():
    as_dict = model_from_args(GPT)
    assert model_from_args(argparse.Namespace(**GPT)) == as_dict
    # the names our schema used before it followed Megatron-LM's dests
    model = model_from_args({**GPT, "norm_epsilon": 1e-6, "disable_bias_linear": True})
    assert model.norm_eps == 1e-6 and model.linear_bias is False


def test_missing_vocabulary_is_one_line():
    with pytest.raises(ConfigError, match="vocab_size is required to plan"):
        model_from_args({k: v for k, v in GPT.items() if k != "vocab_size"})
    assert model_from_args({**GPT, "vocab_size": None, "padded_vocab_size": 1000}).vocab_size == 1000


def test_moe_and_mla_arguments():
    args = {**GPT, "swiglu": True, "normalization": "RMSNorm", "num_experts": 8, "moe_router_topk": 2,
            "moe_ffn_hidden_size": 64, "moe_shared_expert_intermediate_size": 128, "moe_layer_freq": "([0]+[1])",
            "multi_latent_attention": True, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_head_dim": 16,
            "qk_pos_emb_head_dim": 8, "v_head_dim": 16, "mtp_num_layers": 1}
    model = model_from_args(args)
    assert (model.n_experts, model.top_k, model.expert_ffn_dim, model.shared_expert_ffn_hidden_size) == (8, 2, 64, 128)
    assert model.moe_layer_pattern() == [0, 1] and model.mtp_layers == 1
    assert (model.q_lora_rank, model.kv_lora_rank, model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim) == \
        (32, 16, 16, 8, 16)
    with pytest.raises(ConfigError, match="one 0/1 per layer"):
        model_from_args({**args, "moe_layer_freq": "([0]+[1]*3)"})


def test_layout_with_expert_parallelism():
    layout = layout_from_args({**GPT, "tensor_model_parallel_size": 2, "expert_model_parallel_size": 4,
                               "expert_tensor_parallel_size": 1, "use_distributed_optimizer": True, "bf16": True,
                               "micro_batch_size": 2, "global_batch_size": 64}, world_size=16)
    assert (layout.tp, layout.dp, layout.ep, layout.etp, layout.expert_dp) == (2, 8, 4, 1, 4)
    assert (layout.sharding, layout.param_dtype, layout.micro_batch_size, layout.seq_len) == ("optimizer", "bf16", 2, 128)
    assert layout_from_args({**GPT, "use_torch_fsdp2": True}, world_size=4).sharding == "fsdp"


def test_plan_inputs_on_the_neutral_tiny_preset():
    """The existing entry: a neutral ``model:`` block, validated by the Megatron schema, then planned."""
    neutral = yaml.safe_load((CONFIGS_ROOT / "models" / "common" / "llama3_tiny.yaml").read_text())
    params = {**yaml.safe_load((CONFIGS_ROOT / "modules" / "megatron" / "pre_trainer.yaml").read_text()), **neutral,
              "seq_length": 128, "train_iters": 10, "mock_data": True}
    model, layout = plan_inputs(params, world_size=2)
    assert model.total_params() == ModelSpec(**neutral["model"]).total_params()  # 512 needs no padding
    assert model.family == "llama3" and layout.dp == 2 and layout.seq_len == 128


@pytest.mark.e2e
def test_primus_plan_on_the_tiny_megatron_example(run_primus):
    result = run_primus("plan", ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml", env={"WORLD_SIZE": "1"})
    assert result.returncode == 0, result.stderr
    neutral = ModelSpec(**yaml.safe_load((CONFIGS_ROOT / "models" / "common" / "llama3_tiny.yaml").read_text())["model"])
    assert f"parameters        {neutral.total_params():,} total, " in result.stdout


def test_flops_per_step_is_the_plan_convention():
    from primus.backends.megatron.plan import flops_per_step
    from primus.plan.flops import flops_per_token

    llama = dict(num_layers=2, hidden_size=64, num_attention_heads=4, group_query_attention=True, num_query_groups=2,
                 ffn_hidden_size=160, swiglu=True, normalization="RMSNorm", add_bias_linear=False, seq_length=32)
    model = model_from_args({**llama, "padded_vocab_size": 384})
    assert flops_per_step(argparse.Namespace(**llama), 8, padded_vocab_size=384) == \
        flops_per_token(model, 32) * 8 * 32 == (6 * model.matmul_params() + 6 * 2 * 32 * 64) * 8 * 32


def test_model_spec_survives_the_json_trip_to_preflight():
    import json

    for args in (GPT, {**GPT, "num_experts": 4, "moe_layer_freq": "([0]+[1])", "moe_router_topk": 1}):
        model = model_from_args(args)
        assert ModelSpec(**json.loads(json.dumps(model.model_dump()))) == model


def test_block_recompute_of_zero_layers_keeps_activations():
    full = {**GPT, "recompute_granularity": "full", "recompute_method": "block"}
    assert layout_from_args({**full, "recompute_num_layers": 2}, world_size=8).recompute
    assert not layout_from_args({**full, "recompute_num_layers": 0}, world_size=8).recompute


def test_a_pipeline_layout_sets_the_layers_per_stage():
    from primus.plan.estimate import estimate_memory, estimate_params
    from primus.plan.layout import check_layout

    args = {**GPT, "num_layers": 5, "pipeline_model_parallel_size": 2, "pipeline_model_parallel_layout": "Et*1|t*4,L"}
    model, layout = model_from_args(args), layout_from_args(args, world_size=2)
    assert layout.stage_layer_ids(5) == [[0], [1, 2, 3, 4]]
    assert not [i for i in check_layout(model, layout, 2) if i.level == "fail"]  # 5 layers on pp 2: the layout says how
    assert estimate_memory(model, layout).layers_per_stage == 4
    even = layout_from_args({**args, "num_layers": 6, "pipeline_model_parallel_layout": None}, world_size=2)
    assert even.stage_layer_ids(6) == [[0, 1, 2], [3, 4, 5]]
    a = estimate_params(model, layout).per_stage
    b = estimate_params(model, layout_from_args({**args, "pipeline_model_parallel_layout": "Et*4|t*1,L"}, 2)).per_stage
    assert a[1] - b[1] == b[0] - a[0] > 0  # three layers moved from the first stage to the last
    six = {**args, "num_layers": 6}
    assert [i.message for i in check_layout(model_from_args(six), layout_from_args(six, world_size=2), 2)
            if i.level == "fail"] == ["the pipeline layout places 5 decoder layers; the model has 6"]
