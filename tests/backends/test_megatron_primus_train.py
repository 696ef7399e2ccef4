"""Megatron through `primus train` itself: TP=2 and PP=2 on two processes, loss falls."""

import pytest

from tests.conftest import ROOT, assert_seed_train_lines
from tests.helpers import read_metrics

pytestmark = [pytest.mark.e2e]
MEGATRON = ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml"


@pytest.mark.parametrize("layout", ["tensor_model_parallel_size=2", "pipeline_model_parallel_size=2"])
def test_two_ranks_through_primus_train(layout, run_primus, workspace):
    pytest.importorskip("megatron.core")
    name = layout.split("_")[0]
    result = run_primus("train", MEGATRON, "--nproc-per-node", "2", f"exp_name={name}", layout, "train_iters=8",
                        "save_interval=100", "eval_interval=100")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = workspace / "amd" / "root" / name
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 9)) and rows[-1]["loss"] < rows[0]["loss"] - 1.0
    assert all(r["tflops"] > 0 for r in rows)  # Megatron-LM's FLOPs formula on the common path
    assert result.stdout.count("[TRAIN] step=1 ") == 1
    assert_seed_train_lines(result.stdout, list(range(1, 9)))  # the seed PR's regex
    console = result.stdout + result.stderr  # Apex/TE fallbacks are engine warnings: warning.log, not here
    assert "UserWarning" not in console and "warnings.warn" not in console, console[-2000:]
    assert "Apex is not installed" in (run_dir / "logs" / "pre_trainer" / "rank-0" / "warning.log").read_text()
    assert {p.name for p in (run_dir / "logs" / "pre_trainer").iterdir()} == {"rank-0", "rank-1"}
