"""`primus train --slurm -N 2` on a real (throw-away) 2-node Slurm cluster: a job that
completes with one rank per node, and a running job that scancel stops cleanly."""
import json
import os
import re
import subprocess
import time

import pytest

from tests.conftest import PRIMUS, ROOT, TINY_EXAMPLE
from tests.helpers import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]
pytest.importorskip("torchtitan")


def _env(slurm_cluster, tmp_path, tiny_cache):
    return {**os.environ, "SLURM_CONF": slurm_cluster["SLURM_CONF"], "PRIMUS_WORKSPACE": str(tmp_path / "ws"),
            "PRIMUS_CACHE": str(tiny_cache), "PRIMUS_USER_CONFIG": "/nonexistent", "PYTHONUNBUFFERED": "1"}


def _submit(env, *args):
    out = subprocess.run(["timeout", "-k", "10", "120", *PRIMUS, "train", str(TINY_EXAMPLE), "--slurm", "-N", "2",
                          "--rdzv-timeout", "120", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    return re.search(r"submitted Slurm job (\d+)", out.stdout).group(1), out.stdout


def _job(env, job_id):
    out = subprocess.run(["scontrol", "show", "job", job_id], env=env, capture_output=True, text=True, timeout=30)
    return dict(re.findall(r"(\w+)=(\S+)", out.stdout))


def _wait_done(env, job_id, limit=300):
    deadline = time.monotonic() + limit
    while _job(env, job_id).get("JobState") in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"):
        assert time.monotonic() < deadline, f"job {job_id} still {_job(env, job_id).get('JobState')}"
        time.sleep(1)
    return _job(env, job_id)


def test_two_node_job_completes_with_one_rank_per_node(slurm_cluster, tmp_path, tiny_cache):
    env = _env(slurm_cluster, tmp_path, tiny_cache)
    start = time.monotonic()
    job_id, printed = _submit(env, "exp_name=slurm2", "training.steps=4")
    run_dir = tmp_path / "ws" / "amd" / "root" / "slurm2"
    assert f"slurm logs: {run_dir}/slurm/{job_id}.out and {run_dir}/slurm/{job_id}.err" in printed
    job = _wait_done(env, job_id)
    out = (run_dir / "slurm" / f"{job_id}.out").read_text()
    err = (run_dir / "slurm" / f"{job_id}.err").read_text()
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", out[-2000:] + err[-3000:]
    print(f"slurm job {job_id}: {time.monotonic() - start:.1f}s submit-to-done")
    assert job["NodeList"] == "n[1-2]" and "rendezvous n1:29500" in out
    assert "node 1/2 of slurm2: starting 1 worker(s)" in out and f"slurm job {job_id} completed" in out
    assert {p.name for p in (run_dir / "logs" / "pre_trainer").iterdir()} == {"rank-0", "rank-1"}
    hosts = {json.loads(p.read_text())["host"] for p in (run_dir / "nodes").glob("node-*.json")}
    assert hosts == {"n1", "n2"}  # one node's launcher (and rank) per Slurm node
    assert len(read_metrics(run_dir)) == 4
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "completed"


def test_scancel_stops_a_running_job_with_a_checkpoint_and_an_explained_status(slurm_cluster, tmp_path, tiny_cache):
    env = _env(slurm_cluster, tmp_path, tiny_cache)
    job_id, _ = _submit(env, "exp_name=cancelled", "training.steps=5000", "checkpoint.interval=10000")
    run_dir = tmp_path / "ws" / "amd" / "root" / "cancelled"
    out_log, err_log = run_dir / "slurm" / f"{job_id}.out", run_dir / "slurm" / f"{job_id}.err"
    deadline = time.monotonic() + 240
    while not (out_log.exists() and "[TRAIN] step=3 " in out_log.read_text()):  # rank 0's console
        assert time.monotonic() < deadline and _job(env, job_id).get("JobState") in ("PENDING", "RUNNING")
        time.sleep(1)
    subprocess.run(["scancel", job_id], env=env, check=True, timeout=30)
    job = _wait_done(env, job_id, limit=120)
    err = out_log.read_text() + err_log.read_text()
    assert job["JobState"] == "CANCELLED" and job["ExitCode"] != "0:0"
    assert "stopped at step" in err and "on SIGTERM (checkpoint saved)" in err
    assert f"slurm job {job_id} stopped by a signal (preempted, time limit or scancel): checkpoint saved" in err
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "preempted" and manifest["exit_code"] == 75
    assert any((run_dir / "checkpoints").iterdir())
