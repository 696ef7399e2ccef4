"""Megatron checkpoints that do not stall training (``async_save``, on CPU/gloo too), and saves that fail.

``async_save``: megatron-core writes the step-2 checkpoint from a forked process while steps 3-4 train;
the tracker moves to it only once every rank has written it, and it resumes to the uninterrupted
step 3. A save that fails (a full disk: a tmpfs with room for one checkpoint) is a WARNING, the
partial directory is removed, the previous checkpoint stays the newest and training goes on, unless
``primus.checkpoint.fail_on_error``.
"""
from __future__ import annotations

import math
import os
import shutil
import subprocess

import pytest

from tests.backends.megatron.conftest import losses

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.e2e

STEPS = 4


def test_async_save_writes_in_the_background_and_resumes_like_a_synchronous_save(runs):
    full = runs("async", 2, async_save=True, save_interval=2)
    log = (runs.root / "async" / "output.log").read_text()
    assert "iter_0000002 in the background (async_save)" in log
    assert "iter_0000002 (written in the background in" in log
    checkpoints = runs.root / "async" / "checkpoints"
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text() == "4"
    assert (checkpoints / "iter_0000004" / "metadata.json").exists()  # finalized: megatron-core's last step
    resumed = runs("async_resumed", 2, resume_from=("async", 2), save_interval=2)
    assert [r["step"] for r in resumed] == [3, 4]
    assert losses(resumed) == pytest.approx(losses(full)[2:], abs=1e-5)


@pytest.fixture
def one_checkpoint_disk(runs, tmp_path):
    """A tmpfs with room for one checkpoint of the tiny model (measured on the async run's), not two."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a size-limited tmpfs")
    runs("async", 2, async_save=True, save_interval=2)
    iteration = runs.root / "async" / "checkpoints" / "iter_0000002"
    size = sum(f.stat().st_size for f in iteration.rglob("*") if f.is_file())
    mount = tmp_path / "disk"
    mount.mkdir()
    megabytes = math.ceil(size * 1.5 / 2**20) + 1
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(mount)]).returncode != 0:
        pytest.skip("cannot mount tmpfs here")
    yield mount
    subprocess.run(["umount", "-l", str(mount)])


def test_a_save_on_a_full_disk_is_a_warning_and_training_goes_on(runs, one_checkpoint_disk):
    save = one_checkpoint_disk / "checkpoints"
    records = runs("full_disk", 1, save=str(save), save_interval=2)
    assert [r["step"] for r in records] == [1, 2, 3, 4]  # every step trained
    log = (runs.root / "full_disk" / "output.log").read_text()
    warning = next(line for line in log.splitlines() if "checkpoint at iteration 4 was not saved (" in line)
    assert "No space left on device" in warning and "WARNING" in warning
    assert f"removed the partial {save / 'iter_0000004'}; training goes on and the newest checkpoint is " \
           f"{save / 'iter_0000002'}" in log
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert (save / "iter_0000002" / "metadata.json").exists() and not (save / "iter_0000004").exists()


def test_fail_on_error_stops_the_run_at_the_failed_save(runs, one_checkpoint_disk, tmp_path):
    from tests.helpers import train_with_torchrun

    save = one_checkpoint_disk / "checkpoints"
    params = {**runs.base, "save": str(save), "save_interval": 2, "primus": {"checkpoint": {"fail_on_error": True}}}
    result = train_with_torchrun(tmp_path / "stops", "megatron", params, nproc=1, env={"PYTHONWARNINGS": "ignore"})
    assert result.returncode != 0
    assert "No space left on device" in result.stdout + result.stderr
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "2"
