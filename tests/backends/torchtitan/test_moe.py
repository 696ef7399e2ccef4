"""TorchTitan's own MoE (DeepSeek-V3 tiny) through `primus train`, experts split over 2 CPU ranks."""
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e]
pytest.importorskip("torchtitan")

from tests.conftest import ROOT  # noqa: E402
from tests.helpers import cli_in_workspace, read_metrics

MOE_EXAMPLE = ROOT / "examples" / "torchtitan" / "deepseek_v3_tiny-moe-pretrain.yaml"
# fp32 compute: on a CPU with AVX512-BF16/AMX Primus keeps FSDP2's bf16 policy, whose rounding
# (~1e-3 relative) would hide what this test compares (the order of fp32 sums)
FP32 = "training.mixed_precision_param=float32"


def _rows(workspace: Path, exp_name: str) -> list[dict]:
    return read_metrics(workspace / "amd" / "root" / exp_name)


def test_ep2_trains_matches_ep1_and_resumes(run_primus, workspace):
    """EP=2 and EP=1 (FSDP) on the same 2 ranks read the same data and start from the same weights, so
    their curves differ only by the order of floating-point sums: each step within 1e-4 relative
    (measured: 1e-5 absolute over 8 steps). An EP=2 run stopped at step 3 and resumed from its
    checkpoint continues the same curve (measured: equal to 5 decimals)."""
    ep2 = run_primus("train", MOE_EXAMPLE, "--nproc-per-node", "2", "exp_name=ep2", "training.steps=12",
                     "checkpoint.enable=false", FP32, timeout=900)
    assert ep2.returncode == 0, ep2.stdout[-3000:] + ep2.stderr[-3000:]
    rows = _rows(workspace, "ep2")
    losses = [row["loss"] for row in rows]
    assert len(losses) == 12 and losses[-1] < 0.6 * losses[0], losses  # learnable corpus
    imbalance = [row["extra"]["moe_load_imbalance"] for row in rows]
    assert all(1.0 <= value <= 2.0 for value in imbalance), imbalance  # 4 experts, top 2: at most 4/2
    rank1 = (workspace / "amd" / "root" / "ep2" / "logs" / "pre_trainer" / "rank-1" / "info.log").read_text()
    assert "ep=2" in rank1 and "active dimensions: ['batch', 'loss', 'ep', 'fsdp']" in rank1  # experts over EP

    ep1 = run_primus("train", MOE_EXAMPLE, "--nproc-per-node", "2", "exp_name=ep1", "training.steps=6",
                     "checkpoint.enable=false", "parallelism.expert_parallel_degree=1",
                     "lr_scheduler.total_steps=12", FP32, timeout=900)  # the same LR schedule as the 12-step run
    assert ep1.returncode == 0, ep1.stderr[-3000:]
    assert [row["loss"] for row in _rows(workspace, "ep1")] == pytest.approx(losses[:6], rel=1e-4)

    for steps, resume in (("3", []), ("6", ["--resume"])):
        part = run_primus("train", MOE_EXAMPLE, "--nproc-per-node", "2", *resume, "exp_name=ep2-resumed",
                          f"training.steps={steps}", "checkpoint.interval=3", "lr_scheduler.total_steps=12",
                          FP32, timeout=900)
        assert part.returncode == 0, part.stderr[-3000:]
    resumed = _rows(workspace, "ep2-resumed")
    assert [row["step"] for row in resumed] == [1, 2, 3, 4, 5, 6]
    assert [row["loss"] for row in resumed] == pytest.approx(losses[:6], rel=1e-4)


def test_expert_parallelism_on_a_dense_model_is_refused(workspace, tiny_cache):
    """Refused before any rank would start: ``primus train`` in this process."""
    dense = ROOT / "examples" / "torchtitan" / "llama3_tiny-pretrain.yaml"
    result = cli_in_workspace(workspace, tiny_cache, "train", dense, "--nproc-per-node", "2", "exp_name=dense-ep", "parallelism.expert_parallel_degree=2")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "has no experts" in result.stderr
    assert not (workspace / "amd" / "root" / "dense-ep").exists()
