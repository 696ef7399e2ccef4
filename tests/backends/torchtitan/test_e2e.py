"""End to end through `primus train`: the real TorchTitan Trainer, a tiny model, a few steps."""
import json
import math
import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import TINY_EXAMPLE, assert_seed_train_lines
from tests.helpers import cli_in_workspace, read_metrics

pytestmark = [pytest.mark.e2e]
pytest.importorskip("torchtitan")


def _run_dir(workspace, exp_name):
    return workspace / "amd" / "root" / exp_name


def _metrics(run_dir):
    return read_metrics(run_dir)


def test_single_rank_training_leaves_the_full_experiment_tree(run_primus, workspace, tiny_cache):
    result = run_primus("train", TINY_EXAMPLE, "exp_name=one")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = _run_dir(workspace, "one")
    rows = _metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 21))
    assert rows[-1]["loss"] < 0.5 * rows[0]["loss"], [r["loss"] for r in rows]  # learnable corpus
    for key in ("step_time", "samples_per_sec", "samples_per_sec_per_gpu", "tokens_per_sec", "tflops", "mem_gb"):
        assert rows[-1][key] > 0
    assert rows[-1]["mfu"] > 0  # against the CPU's measured GEMM peak
    train_lines = [l for l in result.stdout.splitlines() if "[TRAIN] step=" in l]
    assert len(train_lines) == 20 and "tokens_per_sec=" in train_lines[0]
    assert re.search(r" mfu=\d+\.\d+% ", train_lines[0]), train_lines[0]  # a number on CPU too
    assert_seed_train_lines(result.stdout, list(range(1, 21)))  # the seed PR's regex, mem= after ..._per_gpu=
    _assert_clean_console(result, run_dir)

    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["exit_code"] == 0
    assert manifest["engine"] == "torchtitan" and manifest["engine_version"] == "0.3.0"
    assert manifest["torch"].startswith("2.13") and manifest["world_size"] == 1 and manifest["config_sha256"]
    resolved = yaml.safe_load((run_dir / "config.resolved.yaml").read_text())
    assert resolved["modules"]["pre_trainer"]["params"]["training"]["steps"] == 20

    logs = run_dir / "logs" / "pre_trainer" / "rank-0"
    assert {p.name for p in logs.iterdir()} == {"debug.log", "info.log", "warning.log", "error.log"}
    info = (logs / "info.log").read_text()
    assert "[rank 0/1] [pre_trainer]" in info
    assert "Training starts at step 1" in info  # the engine's own logger lands in our files
    assert "derived attn_backend=sdpa" in info
    assert "MFU peak: " in info and "GEMM" in info  # the CPU peak and where it came from
    assert (run_dir / "metrics.png").stat().st_size > 1000
    assert any((run_dir / "tensorboard").iterdir())
    assert (run_dir / "checkpoints" / "step-20").is_dir()

    again = cli_in_workspace(workspace, tiny_cache, "train", TINY_EXAMPLE, "exp_name=one")  # refused before any rank
    assert again.returncode == 2 and "already holds a completed run" in again.stderr  # nothing overwritten
    assert len(_metrics(run_dir)) == 20


ENGINE_NOISE = ("lspci", "fallback to A100", "UserWarning", "Generating train split", "safetensors.index.json")


def _assert_clean_console(result, run_dir):
    """The README's main job: Primus' lines and [TRAIN] lines only; engine warnings in warning.log."""
    console = result.stdout + result.stderr
    assert not [noise for noise in ENGINE_NOISE if noise in console], console[-3000:]
    records = [line for line in result.stdout.splitlines() if "] [pre_trainer] " in line]
    assert records and all(re.search(r"\] (INFO|WARNING|ERROR) primus(\.\w+)*: ", line) for line in records), \
        [line for line in records if " primus" not in line][:3]
    warning_log = run_dir / "logs" / "pre_trainer" / "rank-0" / "warning.log"
    summary = re.search(r"(\d+) engine warnings? → (\S+warning\.log) \(--verbose shows them\)", result.stdout)
    assert summary and Path(summary.group(2)).resolve() == warning_log.resolve()
    logged = warning_log.read_text()
    assert int(summary.group(1)) == logged.count(" WARNING ") > 0  # counted what was kept off the console
    assert "UserWarning" in logged and "safetensors.index.json" in logged
    assert "fallback to A100" not in logged and "lspci" not in logged  # peak look-up answers from Primus' table


def test_two_ranks_fsdp(run_primus, workspace):
    result = run_primus("train", TINY_EXAMPLE, "--nproc-per-node", "2", "exp_name=two", "training.steps=4",
                        "--verbose")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = _run_dir(workspace, "two")
    rows = _metrics(run_dir)
    assert len(rows) == 4 and rows[-1]["loss"] < rows[0]["loss"]
    assert rows[0]["samples_per_sec"] == pytest.approx(2 * rows[0]["samples_per_sec_per_gpu"])
    assert {p.name for p in (run_dir / "logs" / "pre_trainer").iterdir()} == {"rank-0", "rank-1"}
    assert result.stdout.count("[TRAIN] step=1 ") == 1  # one banner, not one per rank
    assert "UserWarning" in result.stdout and "engine warning" not in result.stdout  # --verbose: shown, not counted
    rank1 = (run_dir / "logs" / "pre_trainer" / "rank-1" / "info.log").read_text()
    assert "[rank 1/2]" in rank1 and "Applied FSDP" in rank1


def test_checkpoint_then_resume_continues_from_the_saved_step(run_primus, workspace):
    first = run_primus("train", TINY_EXAMPLE, "exp_name=resume", "training.steps=4", "checkpoint.interval=2")
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = _run_dir(workspace, "resume")
    second = run_primus("train", TINY_EXAMPLE, "--resume", "exp_name=resume", "training.steps=6",
                        "checkpoint.interval=2")
    assert second.returncode == 0, second.stderr[-3000:]
    assert [r["step"] for r in _metrics(run_dir)] == [1, 2, 3, 4, 5, 6]
    assert "Training starts at step 5" in (run_dir / "logs" / "pre_trainer" / "rank-0" / "info.log").read_text()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [a["status"] for a in manifest["attempts"]] == ["completed", "completed"]


def test_a_failing_rank_fails_the_job_and_logs_its_error(run_primus, workspace):
    result = run_primus("train", TINY_EXAMPLE, "--nproc-per-node", "2", "exp_name=broken", "training.steps=4",
                        env={"PRIMUS_FAULT_INJECT": "raise@rank1:step2"})
    assert result.returncode != 0
    assert "FAILED first failure: rank 1" in result.stderr
    run_dir = _run_dir(workspace, "broken")
    error_log = (run_dir / "logs" / "pre_trainer" / "rank-1" / "error.log").read_text()
    assert "InjectedFault: injected failure on rank 1 at step 2" in error_log
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "failed"


def test_two_pipeline_stages(run_primus, workspace):
    """PP=2 on 2 ranks: 4 microbatches of 1 (local_batch_size 4), the loss from the last stage."""
    result = run_primus("train", TINY_EXAMPLE, "--nproc-per-node", "2", "exp_name=pp", "training.steps=8",
                        "checkpoint.enable=false", "parallelism.pipeline_parallel_degree=2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    losses = [r["loss"] for r in _metrics(_run_dir(workspace, "pp"))]
    assert len(losses) == 8 and min(losses) > 0 and losses[-1] < 0.6 * losses[0], losses  # not TorchTitan's -1
    assert "derived pipeline microbatches=4" in result.stdout


def test_a_non_finite_loss_stops_the_run_before_its_checkpoint(run_primus, workspace):
    """Primus reads the step's loss as its last backward ends (before TorchTitan's optimizer step) and its
    grad norm after it; the first non-finite one is recorded and ends the run with one line (exit 1), before
    that step's checkpoint."""
    result = run_primus("train", TINY_EXAMPLE, "exp_name=nan", "optimizer.lr=1.0e+6", "training.steps=8",
                        "checkpoint.interval=1")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(r"non-finite (loss|grad norm) \(", lines[0]), result.stderr
    run_dir = _run_dir(workspace, "nan")
    rows = _metrics(run_dir)
    bad = rows[-1]["step"]
    assert not (math.isfinite(rows[-1]["loss"]) and math.isfinite(rows[-1]["grad_norm"] or 0.0))
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows[:-1])
    assert f"at step {bad}" in lines[0]
    saved = sorted(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").iterdir())
    assert saved == list(range(1, bad))  # every step before it, none of the NaN state
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "failed"
