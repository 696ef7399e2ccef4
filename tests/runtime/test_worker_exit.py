"""How a rank process ends (``primus.runtime.worker.end_process``): as it would have at interpreter
exit, without the finalization that lets a leftover gloo group abort a run that succeeded."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e]
pytest.importorskip("torch")

TARGETS = "tests.runtime.worker_targets"
REPO = Path(__file__).resolve().parents[2]


def _torchrun(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           *command], capture_output=True, text=True, timeout=300)


def test_a_leftover_gloo_group_with_unwaited_work_does_not_fail_the_rank(tmp_path):
    payload = tmp_path / "payload.json"
    payload.write_text("{}")
    worker = _torchrun("-m", "primus.runtime.worker", f"{TARGETS}:unwaited_collectives", str(payload))
    assert worker.returncode == 0, worker.stderr[-2000:]


def test_without_it_the_same_rank_aborts_at_interpreter_exit(tmp_path):
    """The torch behaviour ``end_process`` exists for (torch 2.13, gloo; pytorch/pytorch#190489 is the
    same abort from a group never destroyed): if this starts failing, the interpreter's own exit is safe again."""
    script = tmp_path / "plain.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(REPO)!r})\nfrom {TARGETS} import unwaited_collectives\n"
                      "sys.exit(unwaited_collectives({}))\n")
    for _ in range(3):  # it aborts about 9 times in 10
        plain = _torchrun(str(script))
        if plain.returncode != 0:
            break
    assert plain.returncode != 0 and "terminate called without an active exception" in plain.stderr


def test_threads_atexit_callbacks_output_and_the_exit_code_survive(tmp_path):
    payload = tmp_path / "payload.json"
    payload.write_text(json.dumps({"folder": str(tmp_path)}))
    result = subprocess.run([sys.executable, "-m", "primus.runtime.worker", f"{TARGETS}:leaves_work_for_the_exit",
                             str(payload)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 3, result.stderr[-2000:]
    assert result.stdout == "printed before the end"
    assert (tmp_path / "thread.txt").read_text() == "done"
    assert (tmp_path / "atexit.txt").read_text() == "done"
