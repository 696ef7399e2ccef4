"""What a CPU step pays that a GPU's does not show, each from a measured probe or a count: the grouped
expert GEMM's own rate, gloo's reduce-scatter run as an all-reduce, the eager AdamW step, FSDP2's copies,
and TorchTitan's TP loss and norm-gradient all-reduces."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from primus.plan.comm import Group, collective_seconds
from primus.plan.layout import ParallelLayout
from primus.plan.model import ModelSpec
from primus.plan.profiles import PROFILES, DeviceProfile
from primus.plan.projection import ProjectionOptions, project

DENSE = ModelSpec(n_layers=4, dim=512, n_heads=8, n_kv_heads=4, ffn_hidden_size=1536, vocab_size=512)
MOE = ModelSpec(n_layers=2, dim=256, n_heads=4, n_kv_heads=4, ffn_hidden_size=512, vocab_size=1024,
                n_experts=8, top_k=2, moe_ffn_hidden_size=256)
CPU = replace(PROFILES["h100"], name="local (cpu)", gemm_tflops_by_threads={1: 0.05, 2: 0.09}, cores=2,
              peak_tflops={"bf16": 0.001, "fp32": 0.09}, hbm_gbps=20.0, overlaps_comm=False,
              intra_node_gbps=2.0, intra_latency_s=1e-3, gpus_per_node=2)


def fp32_layout(**kw):
    base = dict(dp=1, micro_batch_size=2, global_batch_size=2, seq_len=256, param_dtype="fp32", grad_dtype="fp32")
    return ParallelLayout(**{**base, **kw})


def test_grouped_experts_run_at_the_measured_grouped_rate_and_a_loop_at_the_plain_one():
    grouped = replace(CPU, grouped_gemm_tflops={"bf16": 0.004, "fp32": 0.08})
    opts = ProjectionOptions(gemm_dtype="fp32", expert_gemm_dtype="bf16", grouped_experts=True)
    lay = fp32_layout()
    at_plain = project(MOE, lay, grouped, replace(opts, grouped_experts=False)).breakdown["gemm"]
    at_grouped = project(MOE, lay, grouped, opts).breakdown["gemm"]
    assert at_grouped < at_plain / 2  # bf16 grouped 4x the plain bf16 rate: the experts dominate the GEMMs
    assert project(MOE, lay, CPU, opts).breakdown["gemm"] == pytest.approx(at_plain)  # none measured: plain
    # each rank keeps the grouped rate's ratio to fp32, as the plain peaks
    two = grouped.for_ranks_per_node(2)
    assert two.grouped_peak("bf16") / two.peak("fp32") == pytest.approx(0.004 / 0.09)


def test_engines_say_which_experts_are_grouped():
    from primus.backends.megatron.projection import projection_options as megatron
    from primus.backends.torchtitan.projection import projection_options as torchtitan

    assert torchtitan({"model": {"name": "deepseek_v3"}}, gpu=False).grouped_experts
    assert not torchtitan({"model": {"name": "llama4"}}, gpu=False).grouped_experts

    class Args:
        moe_grouped_gemm = True
        pipeline_model_parallel_layout = num_virtual_stages_per_pipeline_rank = None
        num_layers_per_virtual_pipeline_stage = None
    # megatron-core has no grouped kernels on a CPU: SequentialMLP loops over the experts
    assert megatron(Args(), gpu=True).grouped_experts and not megatron(Args(), gpu=False).grouped_experts
    assert not megatron(Args(), gpu=False).ep_probs_alltoall  # the allgather dispatcher (Megatron's default)
    Args.moe_token_dispatcher_type = "alltoall"
    alltoall = megatron(Args(), gpu=False)
    assert alltoall.ep_probs_alltoall and alltoall.ep_count_exchange == "allgather"


def test_gloo_reduce_scatter_costs_an_all_reduce():
    group, size = Group(2, 1), 8e6
    gloo = replace(CPU, reduce_scatter_as_allreduce=True)
    assert collective_seconds("reducescatter", size, group, gloo, 2) == pytest.approx(
        collective_seconds("allreduce", size, group, gloo, 2))
    assert collective_seconds("reducescatter", size, group, CPU, 2) < collective_seconds("allreduce", size, group, CPU, 2)


def test_fsdp_pays_a_collective_latency_per_wrapped_unit():
    lay = fp32_layout(dp=2, global_batch_size=4, micro_batch_size=2, sharding="fsdp")
    slow = replace(CPU, intra_latency_s=0.01)
    gap = project(DENSE, lay, slow).breakdown["dp_comm"] - project(DENSE, lay, CPU).breakdown["dp_comm"]
    # (n_layers + 2) units x (2 gathers of one hop + 1 reduce-scatter of one hop) per micro-batch, + the first
    # gather, + Primus's stop flag all-reduced once a step (two hops)
    assert gap == pytest.approx(0.009 * (6 * 3 + 1 + 2), rel=1e-6)


def test_a_measured_adam_step_replaces_the_bytes_model_and_ranks_share_the_bus():
    lay = fp32_layout()
    base = project(DENSE, lay, CPU).breakdown["optimizer"]
    measured = replace(CPU, optimizer_s_per_param=5e-9)
    from primus.plan.estimate import estimate_params

    params = estimate_params(DENSE, lay).per_rank
    assert project(DENSE, lay, measured).breakdown["optimizer"] == pytest.approx(params * 5e-9)
    assert project(DENSE, lay, measured).breakdown["optimizer"] != pytest.approx(base)
    assert measured.for_ranks_per_node(2).optimizer_s_per_param == pytest.approx(1e-8)


def test_torchtitans_foreach_adam_step_is_costed_at_the_foreach_rate_megatrons_at_the_for_loop_one():
    from primus.backends.torchtitan.projection import projection_options
    from primus.plan.estimate import estimate_params

    lay = fp32_layout()
    measured = replace(CPU, optimizer_s_per_param=2e-9, optimizer_foreach_s_per_param=5e-9)
    params = estimate_params(DENSE, lay).per_rank
    foreach = ProjectionOptions(gemm_dtype="fp32", optimizer_foreach=True)
    assert project(DENSE, lay, measured, foreach).breakdown["optimizer"] == pytest.approx(params * 5e-9)
    assert project(DENSE, lay, measured).breakdown["optimizer"] == pytest.approx(params * 2e-9)
    assert project(DENSE, lay, replace(measured, optimizer_foreach_s_per_param=0.0), foreach).breakdown[
        "optimizer"] == pytest.approx(params * 2e-9)  # a profile without the foreach probe: the for-loop rate
    assert measured.for_ranks_per_node(2).optimizer_foreach_s_per_param == pytest.approx(1e-8)
    # TorchTitan's preset asks for fused AdamW, which a CPU run replaces by foreach; for-loop stays for-loop
    assert projection_options({"optimizer": {"implementation": "fused"}}, gpu=False).optimizer_foreach
    assert not projection_options({"optimizer": {"implementation": "fused"}}, gpu=True).optimizer_foreach
    assert not projection_options({"optimizer": {"implementation": "for-loop"}}, gpu=False).optimizer_foreach


def test_the_gemm_efficiency_slows_plain_gemms_but_not_a_grouped_rate_measured_in_a_training_step():
    opts = ProjectionOptions(gemm_dtype="fp32", expert_gemm_dtype="fp32", grouped_experts=True)
    grouped = replace(CPU, grouped_gemm_tflops={"fp32": 0.08}, efficiency=replace(CPU.efficiency, gemm=1.0))
    slower = replace(grouped, efficiency=replace(CPU.efficiency, gemm=0.5))
    dense_full, dense_half = (project(DENSE, fp32_layout(), p, opts).breakdown["gemm"] for p in (grouped, slower))
    assert dense_half == pytest.approx(2 * dense_full, rel=0.02)  # kernel overheads aside: twice the time
    moe_full, moe_half = (project(MOE, fp32_layout(), p, opts).breakdown["gemm"] for p in (grouped, slower))
    assert moe_half < 2 * moe_full * 0.9  # the experts' grouped GEMMs keep their measured rate


def test_fsdp2_copies_are_paid_even_on_one_rank():
    lay = fp32_layout(sharding="fsdp")
    off = project(DENSE, lay, CPU, ProjectionOptions(gemm_dtype="fp32")).breakdown["dp_comm"]
    on = project(DENSE, lay, CPU, ProjectionOptions(gemm_dtype="fp32", fsdp_copies=True)).breakdown["dp_comm"]
    assert off == 0.0 and on > 0.0  # no collective on one rank, but FSDP2 still copies in, out and the gradients
    from primus.backends.torchtitan.projection import projection_options

    assert projection_options({}, gpu=False).fsdp_copies


def test_torchtitan_tensor_parallel_all_reduces_its_loss_and_each_norm_gradient():
    lay = fp32_layout(tp=2, loss_chunks=8)
    opts = ProjectionOptions(gemm_dtype="fp32")
    bare = project(DENSE, lay, CPU, opts).breakdown
    loss = project(DENSE, lay, CPU, replace(opts, loss_parallel=True)).breakdown
    norms = project(DENSE, lay, CPU, replace(opts, norm_grad_allreduce=True)).breakdown
    one = collective_seconds("allreduce", 1.0, Group(2, 1), CPU, 2)  # latency-bound: tiny messages
    assert loss["tp_comm"] - bare["tp_comm"] == pytest.approx(3 * 8 * one, rel=0.01)
    assert norms["dp_comm"] - bare["dp_comm"] == pytest.approx((2 * 4 + 1) * one, rel=0.01)
    assert project(DENSE, fp32_layout(loss_chunks=8), CPU, replace(opts, loss_parallel=True)).breakdown["tp_comm"] == 0.0


def test_a_stored_profile_without_the_new_probes_loads_and_projects_as_before():
    data = replace(CPU).to_dict()
    for key in ("grouped_gemm_tflops", "reduce_scatter_as_allreduce", "optimizer_s_per_param",
                "optimizer_foreach_s_per_param"):
        data.pop(key)
    loaded = DeviceProfile.from_dict(data)
    assert loaded == CPU
    assert project(MOE, fp32_layout(), loaded).step_time == pytest.approx(project(MOE, fp32_layout(), CPU).step_time)


def test_preflight_probes_measure_the_grouped_gemm_the_training_gemm_and_the_adam_step():
    from primus.plan.devices import measure_cpu_grouped_gemm_tflops, measure_cpu_training_gemm_tflops
    from primus.preflight.perf.profile import optimizer_s_per_param

    assert measure_cpu_grouped_gemm_tflops("fp32", 1, budget_s=0.05, tokens=256, experts=4, dim=64, hidden=128) > 0
    assert measure_cpu_training_gemm_tflops(1, budget_s=0.05, tokens=64, dim=64, hidden=128, layers=1) > 0
    for implementation in ("for-loop", "foreach"):  # a parameter's step: nanoseconds, not microseconds
        assert 0 < optimizer_s_per_param(budget_s=0.05, implementation=implementation) < 1e-6


def test_expert_parallel_pays_the_count_exchange_and_megatron_its_routing_weights_all_to_all():
    from primus.backends.torchtitan.projection import projection_options

    lay = fp32_layout(dp=2, ep=2, global_batch_size=4)
    opts = ProjectionOptions(gemm_dtype="fp32")
    bare = project(MOE, lay, CPU, opts).breakdown["ep_comm"]
    hop = CPU.intra_latency_s  # tiny messages: one hop of latency each on 2 ranks
    counted = project(MOE, lay, CPU, replace(opts, ep_count_exchange="alltoall")).breakdown["ep_comm"]
    assert counted - bare == pytest.approx(2 * hop, rel=0.01)  # 2 MoE layers, one exchange each, forward only
    weights = project(MOE, lay, CPU, replace(opts, ep_probs_alltoall=True)).breakdown["ep_comm"]
    assert weights - bare == pytest.approx(2 * 2 * hop, rel=0.05)  # forward and backward, each MoE layer
    assert projection_options({}, gpu=False).ep_count_exchange == "alltoall"


def test_each_step_pays_its_small_all_reduces_where_there_are_ranks_to_reduce_over():
    one_rank = project(DENSE, fp32_layout(), CPU, ProjectionOptions(gemm_dtype="fp32", step_allreduces=4))
    assert one_rank.breakdown["dp_comm"] == 0.0  # nothing to reduce over on one rank
    lay = fp32_layout(dp=2, global_batch_size=4)
    hop = CPU.intra_latency_s
    base = project(DENSE, lay, CPU, ProjectionOptions(gemm_dtype="fp32")).breakdown["dp_comm"]
    more = project(DENSE, lay, CPU, ProjectionOptions(gemm_dtype="fp32", step_allreduces=4)).breakdown["dp_comm"]
    assert more - base == pytest.approx(4 * 2 * hop, rel=0.01)  # an all-reduce on 2 ranks: two hops
    world = project(DENSE, lay, CPU, ProjectionOptions(gemm_dtype="fp32", grad_norm_group="world")).breakdown
    assert world["dp_comm"] - base == pytest.approx(2 * hop, rel=0.01)  # DP-only Megatron: its norm reduces nothing


def test_a_measured_compute_efficiency_divides_the_layers_compute_and_not_their_communication():
    lay = fp32_layout(tp=2)
    at_one = replace(CPU, efficiency=replace(CPU.efficiency, compute=1.0))
    half = replace(CPU, efficiency=replace(CPU.efficiency, compute=0.5))
    full, slowed = (project(DENSE, lay, p, ProjectionOptions(gemm_dtype="fp32")).breakdown for p in (at_one, half))
    for key in ("compute", "gemm", "attention", "elementwise"):
        assert slowed[key] == pytest.approx(2 * full[key])
    assert slowed["tp_comm"] == pytest.approx(full["tp_comm"]) and slowed["optimizer"] == pytest.approx(full["optimizer"])
    # a rank takes the entry of its thread count; a stored profile keeps the table through JSON
    measured = replace(CPU, compute_efficiency_by_threads={1: 0.8, 2: 0.6})
    assert measured.for_ranks_per_node(2).efficiency.compute == 0.8  # one thread each
    assert measured.for_ranks_per_node(1).efficiency.compute == 0.6  # both cores
    assert DeviceProfile.from_dict(json.loads(json.dumps(measured.to_dict()))) == measured


def test_the_reference_step_is_measured_and_projected_on_this_host():
    from primus.preflight.perf.reference_step import measured_step_seconds, projected_compute_seconds

    measured = measured_step_seconds(1, budget_s=0.05)
    projected = projected_compute_seconds(replace(CPU, gemm_tflops_by_threads={1: 0.05}), 1)
    assert measured > 0 and projected > 0
    # at 0.05 TFLOP/s, at least the time of its GEMMs: 6 x 3.6M matmul parameters x 512 tokens = 11 GFLOP
    assert projected > 1.0e10 / 0.05e12
