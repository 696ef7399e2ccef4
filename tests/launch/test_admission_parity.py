"""A dry-run that says ok <=> the real launch on that device gets past admission.

For every shipped example and a sample of AMD Primus's own files (tests/fixtures/amd_primus), on this
host's CPU and on a named GPU: ``primus train EXP --dry-run [--device D]`` is compared with the real
``primus train EXP`` on a host that *is* that device (the local target faked as a present MI355X with
Transformer Engine), stopped at the first thing a launch does after admission (claiming the run
directory), so nothing is written and no rank starts.
"""
from __future__ import annotations

import pytest

from primus.launch import job
from primus.runtime import admission
from primus.plan import target as target_module
from primus.plan.target import Target
from tests.conftest import ROOT
from tests.helpers import cli_in_process

EXAMPLES = sorted((ROOT / "examples").rglob("*.yaml"))
AMD = sorted((ROOT / "tests" / "fixtures" / "amd_primus").rglob("*.yaml"))
MI355X_HERE = Target("rocm", (9, 5), "mi355x", transformer_engine=True)


class Admitted(BaseException):
    """Raised where a launch claims its run directory: admission is behind it."""


def launch_admitted(monkeypatch, path, target: Target, *extra) -> tuple[bool, str]:
    """The real ``primus train`` on a host whose device is ``target``, up to claiming the run dir."""
    def claim(*_args):
        raise Admitted

    with monkeypatch.context() as patch:
        patch.setattr(target_module, "host_target", lambda: target)
        patch.setattr(job, "host_target", lambda: target)
        patch.setattr(job, "_claim_as_node_zero", claim)
        try:
            result = cli_in_process("train", path, *extra)
        except Admitted:
            return True, ""
    assert result.returncode == 2, result.stderr  # refused: bad input, one line
    return False, _error(result.stderr)


def _error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("primus: error:")]
    assert len(lines) == 1, stderr
    return lines[0]


def dry_run(path, *extra) -> tuple[bool, str]:
    result = cli_in_process("train", path, "--dry-run", *extra)
    if result.returncode == 0:
        assert "admission:  admitted on " in result.stdout
        return True, ""
    assert result.returncode == 2, result.stderr
    return False, _error(result.stderr)


def _nodes(path) -> list[str]:
    """AMD's files are written for 8-GPU nodes; a few layouts need more of them."""
    if "amd_primus" not in str(path):
        return []
    big = any(name in path.name for name in ("70B", "405B"))
    return ["--nproc-per-node", "8", *(["-N", "4", "--master-addr", "node0"] if big else [])]


@pytest.mark.parametrize("path", EXAMPLES + AMD, ids=lambda p: str(p.relative_to(ROOT)))
def test_dry_run_ok_iff_the_launch_passes_admission(path, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRIMUS_WORKSPACE", str(tmp_path / "output"))
    here = target_module.host_target()
    assert dry_run(path, *_nodes(path)) == launch_admitted(monkeypatch, path, here, *_nodes(path))
    # on an MI355X: planned here for it (assumed), launched there (present, Transformer Engine installed)
    assert dry_run(path, "--device", "mi355x", *_nodes(path)) == \
        launch_admitted(monkeypatch, path, MI355X_HERE, *_nodes(path))
    assert not (tmp_path / "output").exists()  # neither wrote anything


def test_the_sample_covers_both_answers(monkeypatch, tmp_path):
    """The parity above is not vacuous: AMD's FP8 files are admitted on the GPU they are written for and
    refused where the recipe has no kernels, and files admitted on a GPU are refused on a CPU (FP8 and the
    precision-aware optimizer need Transformer Engine on a GPU)."""
    monkeypatch.chdir(tmp_path)
    amd = {str(p.relative_to(ROOT / "tests" / "fixtures" / "amd_primus" / "examples")): p for p in AMD}
    assert dry_run(amd["megatron/configs/MI300X/llama3.1_8B-BF16-pretrain.yaml"], "--device", "mi355x",
                   "--nproc-per-node", "8") == (True, "")
    fp8 = amd["megatron/configs/MI355X/llama3.1_8B-FP8-pretrain.yaml"]
    assert dry_run(fp8, "--device", "mi355x", "--nproc-per-node", "8") == (True, "")
    ok, error = dry_run(fp8, "--device", "mi355x", "--nproc-per-node", "8", "fp8_recipe=blockwise")
    assert not ok and "modules.pre_trainer.fp8_recipe: 'blockwise' cannot run on mi355x (gfx950)" in error
    assert dry_run(amd["torchtitan/configs/MI300X/llama3.1_8B-FP8-pretrain.yaml"], "--device", "mi300x",
                   "--nproc-per-node", "8") == (True, "")
    qwen = amd["megatron/configs/MI325X/qwen3_30B_A3B-BF16-pretrain.yaml"]
    assert dry_run(qwen, "--device", "mi325x", "--nproc-per-node", "8") == (True, "")
    monkeypatch.setattr(target_module, "host_target", lambda: Target("cpu"))
    ok, error = dry_run(qwen, "--nproc-per-node", "8")
    assert not ok and "cannot be honoured on cpu (megatron-core's precision-aware optimizer" in error
    ok, error = dry_run(fp8, "--nproc-per-node", "8")
    assert not ok and "modules.pre_trainer.fp8: 'hybrid' cannot run on a CPU host (FP8 training" in error
