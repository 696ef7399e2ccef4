"""Rank death, preemption, restarts, atomic checkpoints, concurrency, disk full (TorchTitan, CPU).

With injected faults, the parts of the goodput add up to the run's wall time, with the recomputed
steps as lost work and the restart's time as restarts."""
import json
import os
import shutil
import signal
import subprocess
import time

import psutil
import pytest

from tests.conftest import PRIMUS, ROOT, TINY_EXAMPLE
from tests.fault_tolerance.conftest import TRAINED
from tests.helpers import read_events, read_metrics

pytestmark = [pytest.mark.e2e]
pytest.importorskip("torchtitan")


def _run_dir(workspace, name):
    return workspace / "amd" / "root" / name


def _losses(run_dir):
    return [(r["step"], r["loss"]) for r in read_metrics(run_dir)]


def _workers_of(run_dir):
    return [p for p in psutil.process_iter(["cmdline"])
            if p.info["cmdline"] and "primus.runtime.worker" in p.info["cmdline"]
            and any(str(run_dir) in part for part in p.info["cmdline"])]


def _goodput_checks(run_dir, stdout):
    """The run's last goodput event: its parts add up, it is the one line and the manifest's record."""
    goodput = read_events(run_dir, "goodput")[-1]
    parts = ("productive_s", "startup_s", "checkpoint_s", "eval_s", "restarts_s", "lost_s", "other_s")
    assert sum(goodput[p] for p in parts) == pytest.approx(goodput["total_s"], abs=0.01)
    # the event rounds the seconds to 1 ms and the ratio to 1e-4: the recomputed ratio may differ by both roundings
    ratio = goodput["productive_s"] / goodput["total_s"]
    assert goodput["goodput"] == pytest.approx(ratio, abs=5e-5 + 5e-4 * (1 + ratio) / goodput["total_s"] + 1e-9)
    assert f"[primus] goodput: {100 * goodput['goodput']:.1f}% (productive {goodput['productive_s']:.1f} s" in stdout
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["goodput"] == {k: v for k, v in goodput.items() if k != "event"}
    attempts = manifest["attempts"]
    assert goodput["total_s"] == pytest.approx(sum(a["wall_end"] - a["wall_start"] for a in attempts), abs=0.01)
    kept = {r["step"]: r["step_time"] for r in read_metrics(run_dir)}  # the last occurrence of each step
    assert goodput["productive_s"] == pytest.approx(sum(kept.values()), abs=0.01)
    return goodput


def test_sigkill_of_one_rank_stops_the_job_and_names_it(run_primus, workspace):
    start = time.monotonic()
    result = run_primus("train", TINY_EXAMPLE, "--nproc-per-node", "2", "exp_name=killed", "training.steps=50",
                        env={"PRIMUS_FAULT_INJECT": "kill@rank1:step3"}, timeout=300,
                        fresh=True)  # real rank processes: the orphan check below looks for them by command line
    assert time.monotonic() - start < 240  # a hang guard: the job stops after the kill (seconds on an idle host)
    assert result.returncode not in (0, 2, 75)
    assert "FAILED first failure: rank 1 (local 1) on" in result.stderr and "signal SIGKILL" in result.stderr
    run_dir = _run_dir(workspace, "killed")
    assert (run_dir / "logs" / "pre_trainer" / "rank-1" / "info.log").read_text().count("[TRAIN]") == 0
    assert "[rank 1/2]" in (run_dir / "logs" / "pre_trainer" / "rank-1" / "debug.log").read_text()
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "failed"
    assert not _workers_of(run_dir)  # no orphans


def test_sigterm_checkpoints_exits_75_and_resume_reproduces_the_run(run_primus, workspace):
    straight = run_primus("train", TINY_EXAMPLE, "exp_name=straight", "training.steps=8")
    assert straight.returncode == 0, straight.stderr[-2000:]
    first = run_primus("train", TINY_EXAMPLE, "exp_name=split", "training.steps=8",
                       env={"PRIMUS_FAULT_INJECT": "term@rank0:step4"})
    assert first.returncode == 75, first.stderr[-2000:]
    split = _run_dir(workspace, "split")
    assert (split / "checkpoints" / "step-4" / ".metadata").exists()  # saved although interval is 10
    assert json.loads((split / "manifest.json").read_text())["status"] == "preempted"
    assert "preempted: checkpoint saved" in first.stdout
    second = run_primus("train", TINY_EXAMPLE, "exp_name=split", "training.steps=8")  # same command: --resume auto
    assert second.returncode == 0, second.stderr[-2000:]
    assert "resuming split" in second.stdout
    # data order, RNG and LR schedule are restored: bitwise-equal losses on CPU
    assert _losses(split) == _losses(_run_dir(workspace, "straight"))
    attempts = json.loads((split / "manifest.json").read_text())["attempts"]
    assert [a["status"] for a in attempts] == ["preempted", "completed"]
    # goodput over both attempts (not the time between them): nothing recomputed, no restart
    first_goodput, goodput = read_events(split, "goodput")
    assert goodput["total_s"] > first_goodput["total_s"] and goodput["startup_s"] > first_goodput["startup_s"]
    assert (goodput["lost_s"], goodput["restarts_s"]) == (0, 0)
    _goodput_checks(split, second.stdout)


def test_max_restarts_recovers_a_killed_worker_from_its_checkpoint(run_primus, workspace):
    result = run_primus("train", TINY_EXAMPLE, "--nproc-per-node", "2", "--max-restarts", "1", "exp_name=restart",
                        "training.steps=6", "checkpoint.interval=2", env={"PRIMUS_FAULT_INJECT": "kill@rank1:step3"},
                        timeout=300)  # two start-ups of 2 ranks: ~150 s on a loaded 2-core host
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = _run_dir(workspace, "restart")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    assert [r["restart"] for r in manifest["attempts"][-1]["restarts"]] == [1]
    steps = [s for s, _ in _losses(run_dir)]
    assert steps[-1] == 6 and 3 in steps  # step 3 ran again after the restart resumed from step 2
    assert "Training starts at step 3" in (run_dir / "logs" / "pre_trainer" / "rank-0" / "info.log").read_text()
    # goodput: the first step 3 is the work lost; the restart's time from it to the next step 3 is restarts
    goodput = _goodput_checks(run_dir, result.stdout)
    rows = read_metrics(run_dir)
    lost = [r for i, r in enumerate(rows) if any(later["step"] == r["step"] for later in rows[i + 1:])]
    assert [r["step"] for r in lost] == [3]
    assert goodput["lost_s"] == pytest.approx(lost[0]["step_time"], abs=0.01)
    retried = rows[rows.index(lost[0]) + 1]
    assert goodput["restarts_s"] == pytest.approx(retried["time"] - retried["step_time"] - lost[0]["time"], abs=0.01)
    assert len(read_events(run_dir, "worker")) >= 1  # rank 0 of the restarted group recorded its end


def test_resume_skips_a_partial_newest_checkpoint(titan_trained, run_primus, workspace):
    shutil.copytree(titan_trained, workspace)  # a copy of the shared 2-step run: checkpoints step-1, step-2
    run_dir = _run_dir(workspace, TRAINED)
    checkpoints = run_dir / "checkpoints"
    shutil.copytree(checkpoints / "step-2", checkpoints / "step-3")
    (checkpoints / "step-3" / ".metadata").unlink()  # a write killed before DCP's final metadata file
    second = run_primus("train", TINY_EXAMPLE, "--resume", f"exp_name={TRAINED}", "training.steps=3",
                        "checkpoint.interval=1")
    assert second.returncode == 0, second.stderr[-2000:]
    assert "Training starts at step 3" in (run_dir / "logs" / "pre_trainer" / "rank-0" / "info.log").read_text()


def _has_a_step(run_dir) -> bool:
    try:
        return bool(read_metrics(run_dir))
    except (OSError, ValueError):  # not written yet, or a row half-written
        return False


def test_a_second_concurrent_launch_is_refused(run_primus, workspace, tiny_cache):
    env = {**os.environ, "PRIMUS_WORKSPACE": str(workspace), "PRIMUS_CACHE": str(tiny_cache)}
    first = subprocess.Popen([*PRIMUS, "train", str(TINY_EXAMPLE), "exp_name=busy", "training.steps=400"],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        run_dir = _run_dir(workspace, "busy")
        deadline = time.monotonic() + 120
        # a first step row: the run is training (its SIGTERM handler is in), not still starting its rank
        while not _has_a_step(run_dir) and time.monotonic() < deadline:
            time.sleep(0.5)
        second = run_primus("train", TINY_EXAMPLE, "exp_name=busy", "training.steps=400")
        assert second.returncode == 2
        assert "another launch is running this experiment (pid" in second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=120) == 75  # and it stops gracefully


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a size-limited tmpfs")
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mount)]).returncode != 0:
        pytest.skip("cannot mount tmpfs here")
    yield mount
    subprocess.run(["umount", "-l", str(mount)])


def test_a_save_on_a_full_disk_is_a_warning_and_training_goes_on(run_primus, small_disk):
    (small_disk / "ballast").write_bytes(b"\0" * 512 * 1024)  # leaves room for one 6 MB checkpoint, not two
    result = run_primus("train", TINY_EXAMPLE, f"workspace={small_disk}", "exp_name=goes_on", "training.steps=4",
                        "checkpoint.interval=2")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = _run_dir(small_disk, "goes_on")
    warning = (run_dir / "logs" / "pre_trainer" / "rank-0" / "warning.log").read_text()
    line = next(line for line in warning.splitlines() if "checkpoint at step 4 was not saved (" in line)
    assert "No space left on device" in line and f"removed the partial {run_dir / 'checkpoints' / 'step-4'}" in line
    assert f"the newest checkpoint is {run_dir / 'checkpoints' / 'step-2'}" in line
    assert (run_dir / "checkpoints" / "step-2" / ".metadata").exists()
    assert not (run_dir / "checkpoints" / "step-4").exists()
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3, 4]


def test_disk_full_with_fail_on_error_fails_clearly_and_keeps_the_previous_checkpoint(run_primus, small_disk, tmp_path):
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * 512 * 1024)  # leaves room for one 6 MB checkpoint, not two
    result = run_primus("train", TINY_EXAMPLE, f"workspace={small_disk}", "exp_name=full", "training.steps=4",
                        "checkpoint.interval=2", "primus.checkpoint.fail_on_error=true")
    assert result.returncode == 1
    assert "FAILED first failure: rank 0" in result.stderr and "is full" in result.stderr
    assert "Traceback" not in result.stderr
    checkpoints = _run_dir(small_disk, "full") / "checkpoints"
    assert (checkpoints / "step-2" / ".metadata").exists()
    assert not (checkpoints / "step-4" / ".metadata").exists()
    # "free space": move the run, partial step-4 included, to a disk with room, and resume there
    roomy = tmp_path / "roomy"
    shutil.copytree(small_disk / "amd", roomy / "amd")
    again = run_primus("train", TINY_EXAMPLE, f"workspace={roomy}", "exp_name=full", "training.steps=4",
                       "checkpoint.interval=2")
    assert again.returncode == 0, again.stderr[-2000:]
    info = (_run_dir(roomy, "full") / "logs" / "pre_trainer" / "rank-0" / "info.log").read_text()
    assert "Training starts at step 3" in info


def test_killing_the_launcher_leaves_no_orphan_workers(workspace, tiny_cache):
    env = {**os.environ, "PRIMUS_WORKSPACE": str(workspace), "PRIMUS_CACHE": str(tiny_cache)}
    launcher = subprocess.Popen([*PRIMUS, "train", str(TINY_EXAMPLE), "--nproc-per-node", "2", "exp_name=orphans",
                                 "training.steps=400"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    run_dir = _run_dir(workspace, "orphans")
    deadline = time.monotonic() + 120
    while len(_workers_of(run_dir)) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(_workers_of(run_dir)) == 2
    launcher.kill()  # SIGKILL: no chance to clean up, as after a node's OOM kill or a scheduler's timeout
    launcher.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _workers_of(run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _workers_of(run_dir)  # the workers died with their launcher (PR_SET_PDEATHSIG)
