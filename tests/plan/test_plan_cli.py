"""`primus plan` from the command line: the world size and device it assumes on its first line,
Wan 2.2 plans, and a closed pipe ends it quietly."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.conftest import PRIMUS, ROOT

LLAMA8B = ROOT / "examples" / "torchtitan" / "llama3.1_8B-pretrain.yaml"
WAN_AC = ROOT / "examples" / "nemo_automodel" / "configs" / "MI355X" / "diffusion" / "wan2_2_t2v_a14b-pretrain-bs32-acon.yaml"
WAN_TINY = ROOT / "examples" / "nemo_automodel" / "wan2_2_tiny-cpu.yaml"


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("GPUS_PER_NODE", "NNODES", "WORLD_SIZE")}
    return {**env, **extra}


def plan(*args, env=None):
    return subprocess.run([*PRIMUS, "plan", *map(str, args)], cwd=ROOT, env=env or _env(), capture_output=True,
                          text=True, timeout=120)


def _plan_here(*args, env=None):
    """`primus plan` in this process: the same text, without an interpreter start per call."""
    from tests.helpers import cli_in_process

    return cli_in_process("plan", *args, env=env or _env())


def test_first_line_states_world_size_and_device_and_their_source():
    plan = _plan_here
    out = plan(LLAMA8B, "--nproc-per-node", "8", "--device", "mi300x")
    first = out.stdout.splitlines()[0]
    assert first == "plan for world size 8 (8 per node x 1 node(s) from --nproc-per-node 8), device mi300x (--device)"
    assert out.returncode == 0 and "fits" in out.stdout  # FSDP over 8 ranks
    one = plan(LLAMA8B, "--device", "h100")
    assert one.stdout.splitlines()[0].startswith("plan for world size 1 (not given (--nproc-per-node, -N)")
    assert one.returncode == 1 and "does NOT fit" in one.stdout  # 8B on one 80 GB device: why the two differ
    env = plan(LLAMA8B, "-N", "2", env=_env(GPUS_PER_NODE="4"))
    assert env.stdout.splitlines()[0].startswith(
        "plan for world size 8 (4 per node x 2 node(s) from $GPUS_PER_NODE=4, -N 2), no device")
    data = json.loads(plan(LLAMA8B, "--nproc-per-node", "8", "--json").stdout)
    assert data["world_size"] == 8 and data["layout"]["dp"] == 8 and "--nproc-per-node 8" in data["world_size_source"]


def test_a_layout_that_does_not_divide_the_given_world_fails(tmp_path):
    pytest.importorskip("megatron.core")
    out = _plan_here(ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml", "--nproc-per-node", "3",
               "tensor_model_parallel_size=2", env=_env(PRIMUS_CACHE=str(tmp_path)))
    assert out.returncode in (1, 2) and "world size (3) is not divisible" in out.stdout + out.stderr


def test_wan_2_2_a14b_plans_per_expert_from_the_latent_shape():
    # Wan's own 832x480 video, one sample per rank
    shape = ("data.dataloader.base_resolution=[832,480]", "step_scheduler.local_batch_size=1",
             "step_scheduler.global_batch_size=8")
    out = _plan_here(WAN_AC, "--nproc-per-node", "8", "--device", "mi300x", *shape)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "14,288,491,584 per expert (28,576,983,168 for 2)" in text
    assert "81 frames 832x480" in text and "latent [16, 21, 60, 104] -> 32,760 video tokens" in text
    assert "FSDP2 over 8 rank(s)" in text and "activation checkpointing" in text and "fits" in text
    bigger = _plan_here(WAN_AC, "--nproc-per-node", "8", "--device", "mi300x", *shape, "fsdp.activation_checkpointing=false")
    assert bigger.returncode == 1 and "does NOT fit" in bigger.stdout


def test_tiny_wan_plans_before_and_after_its_assets_exist(tmp_path):
    out = _plan_here(WAN_TINY, env=_env(PRIMUS_CACHE=str(tmp_path)))
    assert out.returncode == 0, out.stderr
    assert "tiny Wan 2.2 (transformer): 2 blocks, width 32" in out.stdout and "9 frames 64x64" in out.stdout


@pytest.mark.e2e
def test_a_closed_pipe_ends_quietly():
    for args in (["plan", str(LLAMA8B)], ["config", "show", str(LLAMA8B)], ["--help"]):
        command = " ".join([*PRIMUS, *args]) + " | head -1"
        out = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=ROOT, env=_env(), capture_output=True,
                             text=True, timeout=120)
        assert out.stderr == "" and len(out.stdout.splitlines()) == 1, (args, out.stderr[-2000:])
