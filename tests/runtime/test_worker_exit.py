"""How a rank process ends (``primus.runtime.worker.end_process``): as it would have at interpreter
exit, without the finalization that lets a leftover gloo group abort a run that succeeded."""
import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e]
pytest.importorskip("torch")

TARGETS = "tests.runtime.worker_targets"


def test_a_leftover_gloo_group_with_unwaited_work_does_not_fail_the_rank(tmp_path):
    """Ended by the interpreter's own exit instead (``sys.exit``), this rank aborts 9 times in 10 here
    (torch 2.13, gloo; pytorch/pytorch#190489 is the same abort from a group never destroyed)."""
    payload = tmp_path / "payload.json"
    payload.write_text("{}")
    worker = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                             "-m", "primus.runtime.worker", f"{TARGETS}:unwaited_collectives", str(payload)],
                            capture_output=True, text=True, timeout=300)  # a hang guard
    assert worker.returncode == 0, worker.stderr[-2000:]


def test_threads_executors_atexit_callbacks_output_and_the_exit_code_survive(tmp_path):
    payload = tmp_path / "payload.json"
    payload.write_text(json.dumps({"folder": str(tmp_path)}))
    result = subprocess.run([sys.executable, "-m", "primus.runtime.worker", f"{TARGETS}:leaves_work_for_the_exit",
                             str(payload)], capture_output=True, text=True, timeout=120)  # a hang: TimeoutExpired
    assert result.returncode == 3, result.stderr[-2000:]
    assert result.stdout == "printed before the end"
    assert (tmp_path / "thread.txt").read_text() == "done"
    assert (tmp_path / "atexit.txt").read_text() == "done"
