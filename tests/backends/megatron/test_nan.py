"""check_for_nan_in_loss_and_grad, Megatron-LM's default (on): a diverging run stops at the first
non-finite step with one line naming it, exit 1, manifest 'failed', no checkpoint of that state;
turned off, the run goes on as Megatron-LM's would."""
from __future__ import annotations

import json
import math
import re

import pytest

from tests.conftest import ROOT
from tests.helpers import read_metrics

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.e2e
EXAMPLE = ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml"
DIVERGE = ("lr=1.0e6", "min_lr=0", "train_iters=6", "save_interval=1", "eval_interval=100")


def test_a_nan_loss_stops_the_run_before_its_checkpoint(run_primus, workspace):
    result = run_primus("train", EXAMPLE, "exp_name=nan", *DIVERGE)
    assert result.returncode == 1
    output = result.stdout + result.stderr
    lines = [line for line in output.splitlines() if "[primus] FAILED" in line]
    assert len(lines) == 1 and "non-finite " in lines[0]
    # the step's own values decide: its global loss before the update, or its grad norm after it
    step = int(re.search(r"non-finite (?:loss|grad norm) \(\w+\) at step (\d+)", lines[0]).group(1))
    run_dir = workspace / "amd" / "root" / "nan"
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "failed"
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("iter_*"))
    assert saved == [f"iter_{i:07d}" for i in range(1, step)]  # every finite step, not the NaN one
    rows = read_metrics(run_dir)
    assert all(math.isfinite(r["loss"]) for r in rows if r["step"] < step)
    bad = rows[-1]
    assert bad["step"] == step and not (math.isfinite(bad["loss"]) and math.isfinite(bad["grad_norm"] or 0.0))


def test_turned_off_the_run_continues(run_primus, workspace):
    result = run_primus("train", EXAMPLE, "exp_name=nan_off", *DIVERGE, "check_for_nan_in_loss_and_grad=false")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    rows = read_metrics(workspace / "amd" / "root" / "nan_off")
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert not math.isfinite(rows[-1]["loss"])  # what the check would have stopped
