"""`primus plan --search`: legal layouts ranked by projected throughput, paste-ready overrides that the
engine accepts, bad cluster shapes refused in one line, and `--measure` re-ranking by real runs."""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import replace
from pathlib import Path

import pytest

from primus.plan.layout import ParallelLayout, check_layout
from primus.plan.model import ModelSpec
from primus.plan.profiles import PROFILES, write_local_profile
from primus.plan.projection import ProjectionOptions
from primus.plan.search import candidates, search
from tests.conftest import ROOT

MEGATRON_8B = ROOT / "examples" / "megatron" / "configs" / "llama3.1_8B-pretrain.yaml"
TITAN_8B = ROOT / "examples" / "torchtitan" / "llama3.1_8B-pretrain.yaml"
LLAMA70B = ModelSpec(n_layers=80, dim=8192, n_heads=64, n_kv_heads=8, ffn_hidden_size=28672, vocab_size=128256)


def _plan(*args):
    from tests.helpers import cli_in_process

    env = {k: v for k, v in os.environ.items() if k not in ("GPUS_PER_NODE", "NNODES", "WORLD_SIZE")}
    return cli_in_process("plan", *args, env=env)


def test_candidates_are_legal_and_fill_the_world():
    base = ParallelLayout(global_batch_size=64, seq_len=8192)
    seen = list(candidates(LLAMA70B, base, world=64, gpus_per_node=8))
    assert len(seen) > 100
    for layout, vpp, recompute in seen:
        assert layout.world_size == 64 and layout.effective_global_batch_size == 64
        assert not [i for i in check_layout(LLAMA70B, layout, 64) if i.level == "fail"]
        assert layout.tp <= 8 and LLAMA70B.n_layers % (layout.pp * vpp) == 0
        assert vpp == 1 or layout.num_microbatches % layout.pp == 0


def test_search_ranks_by_projected_throughput_and_keeps_what_fits():
    base = ParallelLayout(global_batch_size=64, seq_len=8192)
    profile = replace(PROFILES["mi325x"], gpus_per_node=8)
    result = search(LLAMA70B, base, profile, ProjectionOptions(), nodes=8, gpus_per_node=8, top=10)
    speeds = [r.tokens_per_sec_per_gpu for r in result.rows]
    assert len(result.rows) == 10 and speeds == sorted(speeds, reverse=True)
    assert all(r.memory_gb * 1e9 <= 0.9 * 256 * 2**30 for r in result.rows)
    assert result.fitting < result.candidates  # 70B: some layouts do not fit 256 GB
    text = result.format()
    assert "best layout, as overrides:" in text and text.count("\n") >= 12


def test_plan_search_prints_overrides_the_engine_accepts():
    out = _plan(MEGATRON_8B, "--search", "--device", "mi300x", "--nodes", "1", "--gpus-per-node", "8", "--top", "5",
                "seq_length=8192", "max_position_embeddings=8192")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    best = lines[lines.index("best layout, as overrides:") + 1].split()
    assert "tensor_model_parallel_size=1" in " ".join(best) or any(b.startswith("tensor_model_parallel_size=") for b in best)
    assert len([line for line in lines if line[:2].strip().isdigit()]) == 5
    # the overrides, pasted back, are a valid experiment whose projection is the top row's
    again = _plan(MEGATRON_8B, "--project", "--device", "mi300x", "--nproc-per-node", "8", "seq_length=8192",
                  "max_position_embeddings=8192", *best, "--json")
    assert again.returncode == 0, again.stderr
    top = json.loads(_plan(MEGATRON_8B, "--search", "--device", "mi300x", "--nodes", "1", "--gpus-per-node", "8",
                           "--top", "1", "seq_length=8192", "max_position_embeddings=8192", "--json").stdout)
    assert json.loads(again.stdout)["projected"]["tokens_per_sec_per_gpu"] == pytest.approx(
        top["rows"][0]["tokens_per_sec_per_gpu"], rel=1e-6)


def test_plan_search_torchtitan_overrides():
    out = _plan(TITAN_8B, "--search", "--device", "h100", "--nodes", "2", "--gpus-per-node", "8", "--top", "3")
    assert out.returncode == 0, out.stderr
    best = out.stdout.splitlines()[-1]
    assert "parallelism.tensor_parallel_degree=" in best and "activation_checkpoint.mode=" in best


@pytest.mark.parametrize("nodes", ["0", "-1", "1000000"])
def test_impossible_node_counts_are_one_line_exit_2_fast(nodes):
    start = time.monotonic()
    out = _plan(MEGATRON_8B, "--search", "--device", "mi300x", "--nodes", nodes, "--gpus-per-node", "8")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "--nodes" in out.stderr
    assert time.monotonic() - start < 30  # hang guard, generous


def test_an_empty_search_space_and_a_model_that_fits_nowhere_are_one_line_exit_2():
    start = time.monotonic()
    empty = _plan(MEGATRON_8B, "--search", "--device", "mi300x", "--nodes", "50000", "--gpus-per-node", "8")
    assert empty.returncode == 2 and "search space is empty" in empty.stderr
    assert len(empty.stderr.strip().splitlines()) == 1 and time.monotonic() - start < 30
    nowhere = _plan(ROOT / "examples" / "megatron" / "llama3.1_70B-pretrain.yaml", "--search", "--device", "h100",
                    "--nodes", "1", "--gpus-per-node", "1", "global_batch_size=1", "mock_data=true", "data_path=null")
    assert nowhere.returncode == 2 and "fits nowhere" in nowhere.stderr, nowhere.stderr
    assert len(nowhere.stderr.strip().splitlines()) == 1


@pytest.mark.e2e
def test_search_measure_reranks_the_top_layouts_by_real_runs_on_cpu(tmp_path):
    """Two CPU ranks, the tiny Llama: the top 2 layouts train a few steps and are ranked by measurement."""
    pytest.importorskip("megatron.core")
    cpu = replace(PROFILES["h100"], name="local (cpu)", peak_tflops={"bf16": 0.02, "fp32": 0.02}, hbm_gbps=5.0,
                  memory_gib=8, gemm_tflops_by_threads={1: 0.02}, cores=2, gpus_per_node=2)
    env = {**os.environ, "PRIMUS_PROFILE_CACHE": str(tmp_path / "profiles"), "PRIMUS_CACHE": str(tmp_path / "cache")}
    write_local_profile(cpu, Path(env["PRIMUS_PROFILE_CACHE"]) / f"{socket.gethostname()}.json")
    # the search itself in this process (cli_in_process); the measured layouts are runs it launches
    from tests.helpers import cli_in_process

    out = cli_in_process("plan", ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml", "--search", "--device",
                         "local", "--nodes", "1", "--gpus-per-node", "2", "--top", "3", "--measure", "2",
                         "--measure-steps", "4", "--json", env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout)["rows"]
    measured = [r["measured_step_time"] for r in rows[:2]]
    assert all(m is not None and m > 0 for m in measured), rows
    assert measured == sorted(measured) and rows[2]["measured_step_time"] is None
