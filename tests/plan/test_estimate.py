"""primus plan: parameter counts exact, memory per the documented formula, bad layouts one line each."""
from __future__ import annotations

import json

import pytest

from primus.config.errors import ConfigError
from primus.plan.model import ModelSpec
from primus.cli.plan_report import run_plan
from primus.plan.estimate import GIB, device_memory_bytes, estimate_flops, estimate_memory, estimate_params, make_plan
from primus.plan.layout import ParallelLayout, check_layout

TINY = dict(n_layers=2, dim=64, n_heads=4, n_kv_heads=2, ffn_hidden_size=128, vocab_size=100)


@pytest.fixture
def tiny() -> ModelSpec:
    return ModelSpec(**TINY)


def test_parameter_count_by_hand(tiny):
    embedding = 100 * 64
    attention = 64 * 64 + 64 * 32 + 64 * 32 + 64 * 64  # wq, wk, wv (2 kv heads x 16), wo
    mlp = 3 * 64 * 128
    layer = attention + mlp + 2 * 64  # two RMSNorms
    total = embedding + 2 * layer + 64 + 64 * 100  # final norm, output head
    assert total == 86848
    params = estimate_params(tiny, ParallelLayout())
    assert params.total == params.per_rank == total == tiny.total_params()


def test_parameters_split_by_tp_and_pp(tiny):
    tp2 = estimate_params(tiny, ParallelLayout(tp=2))
    assert tp2.per_rank == 2 * ((12288 + 24576) // 2 + 128) + 6400 // 2 + 64 + 6400 // 2
    pp2 = estimate_params(tiny, ParallelLayout(pp=2))
    assert pp2.per_stage == [36992 + 6400, 36992 + 64 + 6400]
    assert pp2.per_rank == 36992 + 64 + 6400


def test_memory_formula_mixed_precision_adam(tiny):
    n = tiny.total_params()
    layout = ParallelLayout(dp=2, micro_batch_size=2, seq_len=32)
    mem = estimate_memory(tiny, layout)
    assert (mem.weights, mem.grads, mem.optimizer) == (2 * n, 4 * n, (4 + 2 * 4) * n)  # 18 bytes per param
    assert mem.activations_per_layer == 34 * 32 * 2 * 64  # flash attention: no 5as/h term
    assert mem.activations == 2 * mem.activations_per_layer
    assert mem.logits == 4 * 32 * 2 * 100
    assert mem.total == 18 * n + 2 * 34 * 32 * 2 * 64 + 4 * 32 * 2 * 100

    scores = estimate_memory(tiny, layout, flash_attention=False)
    assert scores.activations_per_layer == 32 * 2 * 64 * 34 + 5 * 4 * 32 * 32 * 2  # s*b*h*(34 + 5as/h)
    recompute = estimate_memory(tiny, ParallelLayout(dp=2, micro_batch_size=2, seq_len=32, recompute=True))
    assert recompute.activations_per_layer == 2 * 32 * 2 * 64
    tp2 = estimate_memory(tiny, ParallelLayout(tp=2, micro_batch_size=2, seq_len=32))
    assert tp2.activations_per_layer == 34 * 32 * 2 * 64 // 2


def test_sharding_divides_by_dp(tiny):
    n = tiny.total_params()
    zero1 = estimate_memory(tiny, ParallelLayout(dp=2, sharding="optimizer"))
    assert (zero1.weights, zero1.grads, zero1.optimizer) == (2 * n, 4 * n, 12 * n // 2)
    fsdp = estimate_memory(tiny, ParallelLayout(dp=2, sharding="fsdp"))
    assert (fsdp.weights, fsdp.grads, fsdp.optimizer) == (n, 2 * n, 6 * n)
    fp32 = estimate_memory(tiny, ParallelLayout(param_dtype="fp32"))
    assert fp32.optimizer == 8 * n  # no separate master copy


def test_pipeline_keeps_microbatches_in_flight(tiny):
    layout = ParallelLayout(pp=2, micro_batch_size=1, global_batch_size=8, seq_len=16)
    mem = estimate_memory(tiny, layout)
    assert (mem.layers_per_stage, mem.microbatches_in_flight) == (1, 2)
    assert mem.activations == mem.activations_per_layer * 1 * 2


def test_flops_use_runtime_formula(tiny):
    layout = ParallelLayout(dp=2, micro_batch_size=2, seq_len=32)
    flops = estimate_flops(tiny, layout)
    assert flops.per_token == 6 * tiny.matmul_params() + 6 * 2 * 32 * 64
    assert flops.tokens_per_step == 4 * 32
    assert flops.per_rank_per_step == flops.per_step / 2


@pytest.mark.parametrize("model, layout, world, needle", [
    (TINY, ParallelLayout(tp=2, dp=2), 8, "does not equal the world size 8"),
    ({**TINY, "n_kv_heads": None, "n_heads": 4}, ParallelLayout(tp=8), None, "n_heads (4) is not divisible by tp (8)"),
    (TINY, ParallelLayout(tp=4), None, "n_kv_heads (2) is not divisible by tp (4)"),
    ({**TINY, "n_layers": 3}, ParallelLayout(pp=2), None, "n_layers (3) is not divisible by pp (2)"),
    (TINY, ParallelLayout(dp=2, micro_batch_size=2, global_batch_size=6), None, "global_batch_size (6) is not divisible"),
    (TINY, ParallelLayout(cp=2, seq_len=33), None, "seq_len (33) is not divisible by cp (2)"),
    ({**TINY, "ffn_hidden_size": 100}, ParallelLayout(tp=8, dp=1), None, "ffn width (100) is not divisible by tp (8)"),
])
def test_each_bad_layout_is_one_line(model, layout, world, needle):
    spec = ModelSpec(**{**model, **({"n_heads": 8, "n_kv_heads": 8, "dim": 64} if "ffn width" in needle else {})})
    found = [f for f in check_layout(spec, layout, world) if f.level == "fail"]
    assert len(found) == 1, [f.message for f in found]
    assert needle in found[0].message and "\n" not in found[0].message


def test_good_layout_has_no_failures(tiny):
    assert check_layout(tiny, ParallelLayout(tp=2, pp=2, dp=2, global_batch_size=8), 8) == []


def test_layout_rejects_unknown_keys_and_values():
    with pytest.raises(ConfigError, match="did you mean 'tp'"):
        ParallelLayout.from_dict({"tpp": 2})
    with pytest.raises(ConfigError, match="sharding"):
        ParallelLayout(sharding="zero3")
    with pytest.raises(ConfigError, match="tp must be a positive integer"):
        ParallelLayout(tp=0)


def test_device_table_and_fit(tiny):
    assert device_memory_bytes("mi355x") == 288 * GIB
    assert device_memory_bytes("NVIDIA H100 80GB HBM3") == 80 * GIB
    with pytest.raises(ConfigError, match="did you mean 'h100'"):
        device_memory_bytes("h10")
    plan = make_plan(tiny, ParallelLayout(), "h100")
    assert plan.fits and plan.ideal_step_seconds > 0
    assert make_plan(tiny, ParallelLayout(), device_memory=1000).fits is False


def test_run_plan_text_json_and_exit_status(tiny):
    text, code = run_plan(tiny, ParallelLayout(), "mi300x")
    assert code == 0 and "parameters        86,848 total" in text and "fits" in text
    llama8b = ModelSpec(n_layers=32, dim=4096, n_heads=32, n_kv_heads=8, ffn_hidden_size=14336, vocab_size=128256)
    text, code = run_plan(llama8b, ParallelLayout(seq_len=8192), "h100")
    assert code == 1 and "does NOT fit" in text  # 8B x 18 bytes = 144 GB of states alone
    data = json.loads(run_plan(llama8b, ParallelLayout(seq_len=8192, dp=8, sharding="fsdp", recompute=True),
                               "h100", as_json=True)[0])
    assert data["fits"] is True and data["params"]["total"] == llama8b.total_params()
    text, code = run_plan(tiny, ParallelLayout(pp=3), None)
    assert code == 1 and text.splitlines()[0] == "fail: n_layers (2) is not divisible by pp (3)"
