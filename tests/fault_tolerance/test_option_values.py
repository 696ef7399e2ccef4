"""Plan, preflight and train options are checked before anything runs: a count below 1 or a word where
a number belongs (``--nproc-per-node 0``, ``-N -3``, ``NNODES=-1``, ``GPUS_PER_NODE=abc``,
``WORLD_SIZE=zero``), ``--timeout nan``, an empty ``--device``, a share above 1 in ``--thresholds``, a
``--report-dir`` that cannot be made: one ``primus: error:`` line naming the flag or variable, exit 2,
nothing written. One helper (``primus/config/values.py``) parses them for every command.
"""
from __future__ import annotations

import pytest

from tests.conftest import ROOT
from tests.helpers import cli_in_process

MEGATRON = ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml"


def _refused(result, fragment: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stdout[-1500:] + result.stderr[-1500:]
    assert len(lines) == 1 and lines[0].startswith("primus: error: ") and "Traceback" not in result.stderr, lines
    assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("flags, fragment", [
    (["--nproc-per-node", "0"], "argument --nproc-per-node: must be ≥ 1 (got '0')"),
    (["--nproc-per-node", "-8"], "argument --nproc-per-node: must be ≥ 1 (got '-8')"),
    (["-N", "0"], "argument -N/--nnodes/--nodes: must be ≥ 1 (got '0')"),
    (["-N", "-3"], "must be ≥ 1 (got '-3')"),
    (["--nproc-per-node", "eight"], "expected a whole number ≥ 1 (got 'eight')"),
    (["--device", ""], "argument --device: must not be empty"),
])
def test_plan_flags(flags, fragment, tmp_path):
    _refused(cli_in_process("plan", MEGATRON, *flags, env={"PRIMUS_WORKSPACE": str(tmp_path)}), fragment)


@pytest.mark.parametrize("variable, value, fragment", [
    ("NNODES", "-1", "$NNODES=-1: must be ≥ 1"),
    ("WORLD_SIZE", "0", "$WORLD_SIZE=0: must be ≥ 1"),
    ("GPUS_PER_NODE", "abc", "$GPUS_PER_NODE='abc': expected a whole number"),
    ("WORLD_SIZE", "zero", "$WORLD_SIZE='zero': expected a whole number"),
    ("GPUS_PER_NODE", "9" * 40, "(40 digits): must be ≤ 2147483647"),
])
def test_plan_environment(variable, value, fragment, tmp_path):
    _refused(cli_in_process("plan", MEGATRON, env={"PRIMUS_WORKSPACE": str(tmp_path), variable: value}), fragment)


@pytest.mark.parametrize("variable, value, fragment", [
    ("NNODES", "-1", "$NNODES=-1: must be ≥ 1"),
    ("GPUS_PER_NODE", "abc", "$GPUS_PER_NODE='abc': expected a whole number"),
    ("MASTER_PORT", "70000", "$MASTER_PORT=70000: must be ≤ 65535"),
])
def test_train_environment(variable, value, fragment, tmp_path):
    result = cli_in_process("train", MEGATRON, "--dry-run", env={"PRIMUS_WORKSPACE": str(tmp_path), variable: value})
    _refused(result, fragment)
    assert not any(tmp_path.iterdir())


def test_a_share_above_one_in_thresholds_is_refused(tmp_path):
    thresholds = tmp_path / "t.yaml"
    thresholds.write_text("memory: {usable_fraction: 7}\n")
    _refused(cli_in_process("plan", MEGATRON, "--thresholds", thresholds),
             "threshold 'memory.usable_fraction' must be a share between 0 and 1, got 7")
    thresholds.write_text("expected: {gemm_tflops: {h200: .nan}}\n")
    _refused(cli_in_process("preflight", "--dry-run", "--thresholds", thresholds, "--report-dir", tmp_path / "r"),
             "threshold 'expected.gemm_tflops.h200' must be a finite number > 0")


@pytest.mark.parametrize("timeout", ["nan", "inf", "0", "-5", "soon"])
def test_preflight_timeout(timeout, tmp_path):
    _refused(cli_in_process("preflight", "--dry-run", "--timeout", timeout, "--report-dir", tmp_path / "r"),
             "argument --timeout: ")


def test_preflight_report_dir_below_a_regular_file(tmp_path):
    blocker = tmp_path / "report.txt"
    blocker.write_text("")
    _refused(cli_in_process("preflight", "--dry-run", "--report-dir", blocker / "sub"),
             f"--report-dir: {blocker / 'sub'} cannot be created: {blocker} is a file, not a folder")
    _refused(cli_in_process("preflight", "--dry-run", "--report-dir", blocker), "exists and is not a folder")
    assert blocker.read_text() == ""
