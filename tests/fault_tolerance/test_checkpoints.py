"""Resuming verifies the checkpoint first.

A damaged newest checkpoint: verified before resuming, skipped with a warning naming the bad
file (and moved aside, never deleted), or refused (exit 2) when no checkpoint is usable.

Unit tests use real ``torch.distributed.checkpoint`` directories in both layouts (TorchTitan
``step-N``, Megatron ``iter_NNNNNNN`` with its ``common.pt``) and Megatron-LM's legacy per-rank
``torch.save`` files (``ckpt_format: torch``); the end-to-end test truncates a real TorchTitan
shard and resumes through ``primus train``.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from primus.backends.megatron.checkpoint import ITERATION
from primus.backends.torchtitan.recipes.common import STEP, foreign_checkpoint
from primus.config.errors import ConfigError
from primus.runtime.checkpoints import UnusableCheckpoint, checkpoints_in, newest_usable, problem_of
from tests.conftest import TINY_EXAMPLE
from tests.fault_tolerance.conftest import TRAINED
from tests.helpers import read_metrics

torch = pytest.importorskip("torch")


def _save(path: Path, megatron: bool = False) -> Path:
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.randn(32, 32), "opt": {"m": torch.ones(100)}}, checkpoint_id=str(path))
    if megatron:  # torch_dist's side files
        torch.save({"iteration": 3}, path / "common.pt")
        (path / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    return path


def _shard(path: Path) -> Path:
    return next(path.glob("*.distcp"))


def test_a_whole_checkpoint_passes(tmp_path):
    assert problem_of(_save(tmp_path / "step-2")) is None
    assert problem_of(_save(tmp_path / "iter_0000003", megatron=True)) is None


@pytest.mark.parametrize("damage, expected", [
    (lambda p: os.truncate(_shard(p), 100), "is truncated (100 of"),
    (lambda p: _shard(p).unlink(), "__0_0.distcp is missing"),
    (lambda p: (p / ".metadata").write_bytes(b"\x80\x04garbage"), ".metadata does not load"),
    (lambda p: (p / ".metadata").write_bytes((p / ".metadata").read_bytes()[:50]), ".metadata does not load"),
    (lambda p: (p / "common.pt").write_bytes((p / "common.pt").read_bytes()[:60]), "common.pt is damaged"),
    (lambda p: (p / "metadata.json").write_text('{"sharded'), "metadata.json is damaged"),
])
def test_each_kind_of_damage_is_named(tmp_path, damage, expected):
    path = _save(tmp_path / "iter_0000003", megatron=True)
    damage(path)
    assert expected in problem_of(path)


def test_the_newest_damaged_one_is_skipped_with_a_warning_and_moved_aside(tmp_path):
    _save(tmp_path / "step-2")
    newest = _save(tmp_path / "step-4")
    os.truncate(_shard(newest), 100)
    damaged_bytes = _shard(newest).read_bytes()
    (tmp_path / "step-6").mkdir()  # a save that never finished: no .metadata
    warnings: list[str] = []
    assert newest_usable(tmp_path, STEP, warn=warnings.append, move_damaged=True) == 2
    assert any("step-6/.metadata is missing (the save did not finish)" in w for w in warnings)
    assert any(f"{newest / '__0_0.distcp'} is truncated" in w and f"resuming from {tmp_path / 'step-2'}" in w
               for w in warnings)
    moved = tmp_path / "step-4.damaged"
    assert any(f"moved the damaged checkpoint {newest} to {moved}" in w for w in warnings)
    assert _shard(moved).read_bytes() == damaged_bytes  # nothing deleted, nothing rewritten
    assert [step for step, _ in checkpoints_in(tmp_path, STEP)] == [6, 2]  # out of the engine's sight


def test_without_a_usable_one_resuming_is_refused_naming_the_file(tmp_path):
    for step in (2, 4):
        os.truncate(_shard(_save(tmp_path / f"step-{step}")), 10)
    with pytest.raises(UnusableCheckpoint) as refused:
        newest_usable(tmp_path, move_damaged=True)
    assert isinstance(refused.value, ConfigError)  # exit 2
    assert f"{tmp_path / 'step-4' / '__0_0.distcp'} is truncated" in str(refused.value)
    assert "nothing was deleted" in str(refused.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2", "step-4"]


def test_only_unfinished_saves_mean_a_fresh_start(tmp_path):
    (tmp_path / "step-2").mkdir()
    warnings: list[str] = []
    assert newest_usable(tmp_path, warn=warnings.append) is None
    assert "starting from scratch" in warnings[0]
    assert newest_usable(tmp_path / "absent") is None


def test_megatron_layout_respects_the_tracker(tmp_path):
    _save(tmp_path / "iter_0000003", megatron=True)
    newest = _save(tmp_path / "iter_0000006", megatron=True)
    _save(tmp_path / "iter_0000009", megatron=True)  # beyond the tracker: never picked
    (newest / "common.pt").write_bytes(b"PK\x03\x04 cut")
    assert newest_usable(tmp_path, ITERATION, at_most=6, warn=lambda _: None) == 3
    assert newest_usable(tmp_path, STEP) is None  # layouts do not mix


def _legacy(root: Path, iteration: int, ranks=("mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"),
            tracker: int | None = None) -> Path:
    """Megatron-LM's legacy layout (ckpt_format: torch): one torch.save file per TP x PP rank."""
    path = root / f"iter_{iteration:07d}"
    for rank in ranks:
        (path / rank).mkdir(parents=True)
        torch.save({"iteration": iteration, "model": {"w": torch.randn(64, 64)}}, path / rank / "model_optim_rng.pt")
    (root / "latest_checkpointed_iteration.txt").write_text(str(tracker if tracker is not None else iteration))
    return path


def test_a_whole_legacy_checkpoint_passes(tmp_path):
    assert problem_of(_legacy(tmp_path, 3)) is None
    assert problem_of(_legacy(tmp_path, 4, ranks=("mp_rank_00", "mp_rank_01"))) is None  # no pipeline


@pytest.mark.parametrize("damage, expected", [
    (lambda p: os.truncate(p / "mp_rank_01_000" / "model_optim_rng.pt", 200), "mp_rank_01_000/model_optim_rng.pt is damaged"),
    (lambda p: (p / "mp_rank_00_001" / "model_optim_rng.pt").unlink(), "mp_rank_00_001/model_optim_rng.pt is missing"),
    (lambda p: shutil.rmtree(p / "mp_rank_01_000"), "mp_rank_01_000 is missing (1 of the 4 rank directories)"),
    (lambda p: (p / "mp_rank_00_000" / "distrib_optim.pt").write_bytes(b"PK\x03\x04 cut"), "distrib_optim.pt is damaged"),
])
def test_each_kind_of_legacy_damage_is_named(tmp_path, damage, expected):
    path = _legacy(tmp_path, 3)
    damage(path)
    assert expected in problem_of(path)


def test_a_damaged_legacy_checkpoint_is_moved_aside_and_one_beyond_the_tracker_never_finished(tmp_path):
    _legacy(tmp_path, 2)
    newest = _legacy(tmp_path, 4)
    os.truncate(newest / "mp_rank_00_000" / "model_optim_rng.pt", 100)
    _legacy(tmp_path, 6, tracker=4)  # written, but the tracker was never moved to it
    warnings: list[str] = []
    assert newest_usable(tmp_path, ITERATION, warn=warnings.append, move_damaged=True) == 2
    assert any("does not name iter_0000006 or a later iteration (the save did not finish)" in w for w in warnings)
    assert any("mp_rank_00_000/model_optim_rng.pt is damaged" in w for w in warnings)
    assert (tmp_path / "iter_0000004.damaged" / "mp_rank_00_000" / "model_optim_rng.pt").exists()


@pytest.mark.e2e
def test_resume_falls_back_past_a_truncated_newest_checkpoint(titan_trained, run_primus, workspace):
    """On a copy of the shared 2-step run (checkpoints step-1, step-2): step-2 cut short, step-1 is used."""
    shutil.copytree(titan_trained, workspace)
    run_dir = workspace / "amd" / "root" / TRAINED
    shard = _shard(run_dir / "checkpoints" / "step-2")
    os.truncate(shard, shard.stat().st_size // 2)  # a copy cut short
    damaged_bytes = shard.read_bytes()
    second = run_primus("train", TINY_EXAMPLE, "--resume", f"exp_name={TRAINED}", "training.steps=3",
                        "checkpoint.interval=1")
    assert second.returncode == 0, second.stderr[-2000:]
    assert f"{shard} is truncated" in second.stdout and "resuming from" in second.stdout
    info = (run_dir / "logs" / "pre_trainer" / "rank-0" / "info.log").read_text()
    assert "Training starts at step 2" in info  # from step-1, not the damaged step-2
    assert (run_dir / "checkpoints" / "step-2.damaged" / shard.name).read_bytes() == damaged_bytes  # kept as it was
    assert (run_dir / "checkpoints" / "step-2" / ".metadata").exists()  # saved again, whole
    steps = [r["step"] for r in read_metrics(run_dir)]
    assert steps == [1, 2, 2, 3]


@pytest.mark.parametrize("tamper, said", [
    (lambda p: ((p / ".metadata").unlink(), (p / ".metadata").mkdir()), ".metadata is not a file"),
    (lambda p: (torch.save({"iteration": 4}, p / "common.pt"),
                (p / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')),
     "holds a Megatron checkpoint (metadata.json, common.pt), not TorchTitan's"),
])
def test_a_tampered_newest_step_falls_back_said(tmp_path, tamper, said):
    _save(tmp_path / "step-2")
    newest = _save(tmp_path / "step-4")
    tamper(newest)
    warnings: list[str] = []
    assert newest_usable(tmp_path, STEP, warn=warnings.append, move_damaged=True, foreign=foreign_checkpoint) == 2
    assert any(said in w and f"resuming from {tmp_path / 'step-2'}" in w for w in warnings), warnings
    assert (tmp_path / "step-4.damaged").is_dir()


def test_checkpoints_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "checkpoints").write_text("oops")
    with pytest.raises(UnusableCheckpoint, match="checkpoints is not a folder: move it away"):
        newest_usable(tmp_path / "checkpoints")
    assert (tmp_path / "checkpoints").read_text() == "oops"


@pytest.mark.e2e
def test_resume_with_checkpoints_a_regular_file_is_one_line(titan_trained, run_primus, workspace):
    shutil.copytree(titan_trained, workspace)  # a copy of the shared 2-step run
    checkpoints = workspace / "amd" / "root" / TRAINED / "checkpoints"
    shutil.rmtree(checkpoints)
    checkpoints.write_text("not a folder")
    second = run_primus("train", TINY_EXAMPLE, "--resume", f"exp_name={TRAINED}", "training.steps=3")
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    lines = second.stderr.strip().splitlines()
    assert lines == [f"primus: error: {checkpoints} is not a folder: move it away (checkpoints are saved in a "
                     "folder of that name)"]
