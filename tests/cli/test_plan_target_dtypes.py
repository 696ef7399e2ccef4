"""A plan for a named device uses that device's dtypes, never this host's CPU's: the host-CPU bf16 rule
(``PRIMUS_CPU_BF16``, ``cpu_bf16_decision``) applies only to a run on a CPU."""
from __future__ import annotations

import os

import pytest

from primus.plan.target import host_target
from tests.conftest import ROOT
from tests.helpers import cli_in_process

EXAMPLES = [ROOT / "examples" / "megatron" / "configs" / "llama3.1_8B-pretrain.yaml",
            ROOT / "examples" / "torchtitan" / "llama3.1_8B-pretrain.yaml",
            ROOT / "examples" / "nemo_automodel" / "configs" / "MI355X" / "diffusion" / "wan2_2_t2v_a14b-pretrain.yaml"]


def plan(example, mode: str, *flags) -> str:
    result = cli_in_process("plan", example, "--nproc-per-node", "8", *flags,
                            env={**os.environ, "PRIMUS_CPU_BF16": mode})
    assert result.returncode in (0, 1), result.stderr  # 1: does not fit (a verdict, not an error)
    return result.stdout


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.parent.name + "/" + p.name)
def test_plan_for_mi355x_prints_the_same_bytes_whatever_the_cpu_decides(example, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with_bf16, without = plan(example, "force", "--device", "mi355x"), plan(example, "off", "--device", "mi355x")
    assert with_bf16 == without
    assert "mi355x (not on this host: assumed" in without
    if host_target().gpu:
        pytest.skip("this host has a GPU: its own plans do not read the CPU's bf16 either")
    if example != EXAMPLES[0]:
        return  # TorchTitan's and AutoModel's plans read the experiment's dtypes, not the CPU's derived ones
    # the rule is real: the same plan for this CPU changes with the decision (bf16 halves the weights)
    assert plan(example, "force") != plan(example, "off")


def test_the_blog_plan_for_mi355x_holds_bf16_weights():
    out = plan(EXAMPLES[0], "off", "--device", "mi355x")
    assert "  weights            14.96" in out  # 8.03e9 parameters x 2 bytes, not the 29.92 of fp32


@pytest.mark.parametrize("argv", [("config", "validate"), ("plan",), ("train", "--dry-run")])
def test_an_unknown_device_is_exit_2_and_one_line(argv, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    result = cli_in_process(argv[0], *argv[1:], EXAMPLES[0], "--device", "mi350x")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("primus: error:") and "mi350x" in errors[0]


def test_a_launch_for_a_device_this_host_lacks_is_one_line_and_writes_nothing(monkeypatch, tmp_path):
    if host_target().name == "mi355x":
        pytest.skip("this host is an MI355X")
    monkeypatch.chdir(tmp_path)
    result = cli_in_process("train", EXAMPLES[0], "--device", "mi355x", f"workspace={tmp_path / 'out'}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"primus: error: --device mi355x: this host has no mi355x ({host_target().name} here); --device names the "
        "target of config validate, plan and train --dry-run, a launch runs on the device it is started on"]
    assert not (tmp_path / "out").exists()
