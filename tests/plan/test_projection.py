"""Step-time projection: the cost model's parts (rooflines, rings, bubble, overlap), the device profiles
(named and measured), and `primus plan --project` from the command line."""
from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest

from primus.config.errors import ConfigError
from primus.plan.comm import Group, Groups, collective_seconds, link
from primus.plan.layout import ParallelLayout
from primus.plan.model import ModelSpec
from primus.plan.profiles import PROFILES, SOURCES, get_profile, read_local_profile, write_local_profile
from primus.plan.projection import ProjectionOptions, project
from tests.conftest import ROOT

LLAMA8B = ModelSpec(n_layers=32, dim=4096, n_heads=32, n_kv_heads=8, ffn_hidden_size=14336, vocab_size=128256)
MEGATRON_8B = ROOT / "examples" / "megatron" / "configs" / "llama3.1_8B-pretrain.yaml"


def layout(**kw):
    base = dict(dp=8, micro_batch_size=1, global_batch_size=8, seq_len=8192, sharding="optimizer")
    return ParallelLayout(**{**base, **kw})


def test_every_named_device_cites_each_of_its_numbers():
    for name, profile in PROFILES.items():
        cited = SOURCES[name]
        assert profile.peak_tflops["fp8"] == pytest.approx(2 * profile.peak_tflops["bf16"], rel=1e-3), name
        for tflops in (profile.peak_tflops["bf16"], profile.peak_tflops["fp8"]):
            assert f"{tflops:,g}" in cited, (name, tflops)
        assert f"{profile.hbm_gbps / 1000:g} TB/s" in cited and f"{profile.memory_gib:g} GB" in cited, name
        assert f"{profile.intra_node_gbps:g} per direction" in cited, name
    assert get_profile("mi355x").sources["peaks"].startswith("AMD Instinct MI355X")


def test_unknown_device_is_one_line_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"unknown device 'mi300'.*did you mean 'mi300x'"):
        get_profile("mi300")


def test_breakdown_adds_up_to_the_step_and_mfu_follows_the_flop_convention():
    from primus.plan.flops import flops_per_token

    result = project(LLAMA8B, layout(), get_profile("h100"))
    b = result.breakdown
    parts = b["compute"] + b["tp_comm"] + b["cp_comm"] + b["ep_comm"] + b["pp_comm"] + b["dp_comm"] + b["bubble"] + b["optimizer"]
    assert parts == pytest.approx(result.step_time)
    assert b["gemm"] + b["attention"] + b["elementwise"] == pytest.approx(b["compute"])
    tokens = 8 * 8192
    assert result.tokens_per_sec_per_gpu == pytest.approx(tokens / result.step_time / 8)
    assert result.mfu == pytest.approx(flops_per_token(LLAMA8B, 8192) * tokens / result.step_time / 8 / 989.4e12)
    assert 0.2 < result.mfu < 0.75  # a dense 8B on H100: somewhere real runs land


def test_compute_scales_with_tokens_and_recompute_costs_a_forward():
    profile = get_profile("mi300x")
    one = project(LLAMA8B, layout(global_batch_size=8), profile).breakdown["compute"]
    two = project(LLAMA8B, layout(global_batch_size=16), profile).breakdown["compute"]
    assert two == pytest.approx(2 * one, rel=1e-6)  # two micro-batches per rank
    full = project(LLAMA8B, layout(recompute=True), profile).breakdown["compute"]
    assert 1.25 < full / one < 1.4  # forward is about a third of forward + backward
    selective = project(LLAMA8B, layout(), profile, ProjectionOptions(recompute="selective")).breakdown["compute"]
    assert one < selective < full


def test_fp8_linears_are_faster_but_not_twice():
    profile = get_profile("h100")
    bf16 = project(LLAMA8B, layout(), profile).step_time
    fp8 = project(LLAMA8B, layout(), profile, ProjectionOptions(gemm_dtype="fp8")).step_time
    assert 1.1 < bf16 / fp8 < 2.0  # attention, the head and elementwise stay 16-bit


def test_pipeline_bubble_is_pp_minus_one_over_vpp_micro_batches():
    profile = get_profile("h100")
    lay = layout(pp=4, dp=2, global_batch_size=16)  # 8 micro-batches per pipeline
    plain = project(LLAMA8B, lay, profile)
    per_mb = plain.breakdown["compute"] / plain.microbatches
    assert plain.microbatches == 8
    assert plain.breakdown["bubble"] == pytest.approx(3 * per_mb)
    interleaved = project(LLAMA8B, lay, profile, ProjectionOptions(vpp=2))
    assert interleaved.breakdown["bubble"] == pytest.approx(1.5 * per_mb)
    assert interleaved.breakdown["pp_comm"] == pytest.approx(2 * plain.breakdown["pp_comm"])
    with pytest.raises(ConfigError, match="vpp > 1"):
        project(LLAMA8B, layout(), profile, ProjectionOptions(vpp=2))


def test_tensor_parallel_traffic_is_exposed_unless_overlapped():
    profile = get_profile("mi300x")
    lay = layout(tp=8, dp=1, global_batch_size=1)
    exposed = project(LLAMA8B, lay, profile, ProjectionOptions(sequence_parallel=True)).breakdown["tp_comm"]
    hidden = project(LLAMA8B, lay, profile, ProjectionOptions(tp_comm_overlap=True)).breakdown["tp_comm"]
    assert exposed > 0 and hidden == pytest.approx(0.2 * exposed)


def test_data_parallel_gradients_hide_behind_backward_when_overlapped():
    profile = get_profile("mi325x")
    lay = layout(dp=64, global_batch_size=64, sharding="none")
    over = project(LLAMA8B, lay, profile, ProjectionOptions(overlap_grad_reduce=True)).breakdown["dp_comm"]
    bare = project(LLAMA8B, lay, profile, ProjectionOptions(overlap_grad_reduce=False)).breakdown["dp_comm"]
    assert 0 < over < bare


def test_on_a_cpu_the_engines_overlap_hides_no_communication():
    # gloo copies on the cores the ranks compute on: FSDP's gathers and scatters are all exposed
    gpu = get_profile("mi325x")
    cpu = replace(gpu, overlaps_comm=False)
    lay = layout(dp=8, global_batch_size=8, sharding="fsdp")
    hidden = project(LLAMA8B, lay, gpu).breakdown["dp_comm"]
    exposed = project(LLAMA8B, lay, cpu).breakdown["dp_comm"]
    assert exposed > 2 * hidden and exposed > 0
    assert project(LLAMA8B, lay, cpu).breakdown["compute"] == project(LLAMA8B, lay, gpu).breakdown["compute"]


def test_ring_costs_and_which_links_a_group_crosses():
    h100 = get_profile("h100")
    inside, across = Group(8, 1), Group(8, 8)
    assert not inside.crosses_nodes(8) and across.crosses_nodes(8)
    bw_in, _ = link(h100, inside, 8)
    bw_out, _ = link(h100, across, 8)
    assert bw_in == pytest.approx(450e9 * 0.8) and bw_out == pytest.approx(50e9 * 0.8)
    # a 16-rank group of stride 1: 8 of its ranks per node share the reduction (hierarchical)
    assert link(h100, Group(16, 1), 8)[0] == pytest.approx(min(450e9, 8 * 50e9) * 0.8)
    size = 1e9
    ar = collective_seconds("allreduce", size, inside, h100, 8)
    ag = collective_seconds("allgather", size, inside, h100, 8)
    assert ar == pytest.approx(14 * h100.intra_latency_s + size * 2 * 7 / 8 / bw_in)
    assert ag == pytest.approx(7 * h100.intra_latency_s + size * 7 / 8 / bw_in)
    assert collective_seconds("allreduce", size, Group(1, 1), h100, 8) == 0.0
    g = Groups.of(tp=8, cp=1, dp=4, pp=2, ep=1, etp=8)
    assert g.dp.stride == 8 and g.pp.stride == 32 and g.grad.size == 4


def test_local_profile_round_trips_and_splits_cores_among_ranks(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_PROFILE_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match="primus preflight"):
        get_profile("local")
    cpu = replace(PROFILES["h100"], name="local (cpu)", gemm_tflops_by_threads={1: 0.02, 2: 0.035}, cores=2,
                  peak_tflops={"bf16": 0.035, "fp32": 0.035}, hbm_gbps=10.0)
    path = write_local_profile(cpu)
    assert path.parent == tmp_path and read_local_profile() == cpu
    assert get_profile("local").peak("fp32") == pytest.approx(0.035e12)
    two = get_profile("local").for_ranks_per_node(2)
    # one thread alone does 0.02, but two ranks at once share what both cores do together (0.035)
    assert two.peak("fp32") == pytest.approx(0.0175e12) and two.hbm_gbps == pytest.approx(5.0)
    four = replace(cpu, gemm_tflops_by_threads={1: 0.02, 4: 0.08}, cores=4).for_ranks_per_node(2)
    assert four.peak("fp32") == pytest.approx(0.04e12)  # cores that scale: two threads each, 0.04 per rank


def _plan(*args):
    from tests.helpers import cli_in_process

    env = {k: v for k, v in os.environ.items() if k not in ("GPUS_PER_NODE", "NNODES", "WORLD_SIZE")}
    return cli_in_process("plan", *args, env=env)


def test_plan_project_prints_the_machine_readable_line_and_json_has_the_same_figures():
    args = (MEGATRON_8B, "--project", "--device", "mi300x", "--nproc-per-node", "8", "seq_length=8192",
            "max_position_embeddings=8192")
    out = _plan(*args)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("projected: step_time=") and " tokens_per_sec_per_gpu=" in line and " mfu=" in line
    fields = dict(item.split("=", 1) for item in line.split()[1:])
    data = json.loads(_plan(*args, "--json").stdout)["projected"]
    assert fields["step_time"] == f"{data['step_time']:.3f}s"
    assert fields["tokens_per_sec_per_gpu"] == f"{data['tokens_per_sec_per_gpu']:.1f}"
    assert fields["mfu"] == f"{100 * data['mfu']:.2f}%" and fields["mem"] == f"{data['memory_gb']:.2f}GB"
    assert "compute" in out.stdout and "assumptions:" in out.stdout


def test_plan_project_bad_device_is_one_line_exit_2():
    out = _plan(MEGATRON_8B, "--project", "--device", "mi999")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "unknown device 'mi999'" in out.stderr and "Traceback" not in out.stderr


def test_a_gpu_projection_keeps_bf16_on_a_cpu_without_bf16_units():
    # the host-CPU bf16 rule (bf16 off without AVX512-BF16/AMX) must not turn a GPU projection into fp32
    args = (MEGATRON_8B, "--project", "--device", "mi300x", "--nproc-per-node", "8", "bf16=true", "--json")
    from tests.helpers import cli_in_process

    env = {k: v for k, v in os.environ.items() if k not in ("GPUS_PER_NODE", "NNODES", "WORLD_SIZE")}
    without = json.loads(cli_in_process("plan", *args, env={**env, "PRIMUS_CPU_BF16": "off"}).stdout)["projected"]
    native = json.loads(cli_in_process("plan", *args, env={**env, "PRIMUS_CPU_BF16": "force"}).stdout)["projected"]
    assert without["step_time"] == pytest.approx(native["step_time"])
    assert "linears in bf16" in " ".join(without["assumptions"])


def test_a_cpu_profile_keeps_its_measured_bf16_rate_per_rank_and_fp32_runs_use_the_fp32_one():
    # a CPU without bf16 units: bf16 GEMMs emulated, 50x slower than fp32 (measured by preflight)
    cpu = replace(PROFILES["h100"], name="local (cpu)", gemm_tflops_by_threads={1: 0.02, 2: 0.035}, cores=2,
                  peak_tflops={"bf16": 0.0007, "fp32": 0.035}, hbm_gbps=10.0, overlaps_comm=False)
    two = cpu.for_ranks_per_node(2)
    assert two.peak("fp32") == pytest.approx(0.0175e12) and two.peak("bf16") == pytest.approx(0.00035e12)
    fp32 = layout(dp=2, global_batch_size=2, seq_len=512, param_dtype="fp32", grad_dtype="fp32")
    same_peaks = replace(two, peak_tflops={"bf16": 0.0175, "fp32": 0.0175})
    # an fp32 run's attention, router and MFU read the fp32 rate, not the (slow) bf16 one
    assert project(LLAMA8B, fp32, two).breakdown == pytest.approx(project(LLAMA8B, fp32, same_peaks).breakdown)


def test_torchtitan_moe_experts_are_costed_in_bf16_whatever_the_mixed_precision():
    from primus.backends.torchtitan.projection import projection_options

    moe = ModelSpec(n_layers=2, dim=256, n_heads=4, n_kv_heads=4, ffn_hidden_size=512, vocab_size=1024,
                    n_experts=8, top_k=2, moe_ffn_hidden_size=256)
    fp32 = {"training": {"mixed_precision_param": "float32"}, "model": {"name": "deepseek_v3"}}
    options = projection_options(fp32, gpu=False)
    assert options.gemm_dtype == "fp32" and options.expert_gemm_dtype == "bf16"
    assert projection_options({**fp32, "model": {"name": "llama4"}}, gpu=False).expert_gemm_dtype is None
    cpu = replace(PROFILES["h100"], name="local (cpu)", peak_tflops={"bf16": 0.0007, "fp32": 0.035}, hbm_gbps=10.0,
                  overlaps_comm=False)
    lay = layout(dp=1, global_batch_size=1, seq_len=512, param_dtype="fp32", grad_dtype="fp32")
    as_fp32 = project(moe, lay, cpu, replace(options, expert_gemm_dtype=None)).breakdown["gemm"]
    assert project(moe, lay, cpu, options).breakdown["gemm"] > 5 * as_fp32  # the experts dominate, at 1/50 the rate
