"""Naming the rank a hung job waits for, from the ranks' dumps; the watchdog that writes them."""
import json
import subprocess
import sys
import time

import pytest

from primus.runtime.hangs import DUMP, VERDICT, HangWatch, analyse, summarise
from primus.runtime.phases import PhaseClock
from primus.runtime.watchdog import Deadline, Watchdog
from tests.helpers import ROOT


def entry(group: str, seq: int, op: str = "gloo:all_reduce", retired: bool = True) -> dict:
    """One flight-recorder entry as torch 2.13 dumps it (``_dump_fr_trace_json``)."""
    return {"process_group": [group, "default_pg" if group == "0" else "undefined"], "collective_seq_id": seq,
            "is_p2p": False, "profiling_name": op, "input_sizes": [[4]], "retired": retired, "state": "scheduled"}


def dump(rank: int, entries: list[dict], phase: str, groups: dict[str, list[int]], step: int = 12) -> dict:
    return {"rank": rank, "host": f"node-{rank // 2}", "last_step": step, "phase": phase,
            "groups": summarise({"entries": entries}, groups)}


def test_summary_keeps_the_last_collective_of_each_group_the_rank_is_in():
    record = {"entries": [entry("0", 6), entry("1", 2), entry("0", 7, "gloo:all_gather", retired=False)]}
    summary = summarise(record, {"0": [0, 1, 2, 3], "1": [0, 1], "5": [0]})
    assert summary["0"] == {"ranks": [0, 1, 2, 3], "last_seq": 7, "op": "gloo:all_gather", "sizes": [[4]],
                            "completed": False, "desc": "default_pg"}
    assert summary["1"]["last_seq"] == 2 and summary["1"]["completed"]
    assert "5" not in summary  # a group of one waits for nobody


def test_the_rank_that_never_entered_the_collective_is_named():
    world = {"0": [0, 1, 2, 3]}
    waiting = [entry("0", 6), entry("0", 7, "gloo:all_gather", retired=False)]
    dumps = {r: dump(r, waiting, "comm", world) for r in (0, 2, 3)}
    dumps[1] = dump(1, [entry("0", 6)], "compute", world)  # stopped before collective 7
    verdict = analyse(dumps, 4, "logs/pre_trainer/rank-*")
    assert verdict["ranks"] == [1] and verdict["waiting"] == [0, 2, 3]
    assert verdict["line"] == ("hang: rank 1 (node-0) never entered gloo:all_gather #7 of process group 0 "
                               "(default_pg) that rank 0, 2, 3 wait in; it is in compute after step 12; stacks and "
                               "last collectives in logs/pre_trainer/rank-*")


def test_without_a_flight_recorder_the_rank_outside_communication_is_named():
    dumps = {0: dump(0, [], "comm", {}), 1: dump(1, [], "data", {})}
    verdict = analyse(dumps, 2, "x")
    assert verdict["ranks"] == [1] and verdict["line"].startswith("hang: rank 1 (node-0) never entered the collective")


def test_ranks_without_a_dump_are_said_and_so_is_a_mismatch():
    world = {"0": [0, 1]}
    silent = analyse({0: dump(0, [entry("0", 3, retired=False)], "comm", world)}, 3, "x")
    assert silent["silent"] == [1, 2] and silent["line"].startswith("hang: rank 1, 2 wrote no dump")
    both_waiting = {r: dump(r, [entry("0", 3, retired=False)], "comm", world) for r in (0, 1)}
    assert analyse(both_waiting, 2, "x")["line"].startswith("hang: no rank is missing from a collective")


def test_the_launcher_watch_says_the_verdict_once_and_writes_it_for_the_ranks(tmp_path):
    said, recorded = [], []
    world = {"0": [0, 1]}
    with HangWatch(tmp_path, 2, said.append, recorded.append, poll_s=0.05) as watch:
        for rank, (entries, phase) in {0: ([entry("0", 4, retired=False)], "comm"), 1: ([entry("0", 3)], "data")}.items():
            (tmp_path / f"rank-{rank}").mkdir()
            (tmp_path / f"rank-{rank}" / DUMP).write_text(json.dumps(dump(rank, entries, phase, world)))
        deadline = time.monotonic() + 30
        while watch.verdict is None and time.monotonic() < deadline:
            time.sleep(0.05)
    assert said == [watch.verdict["line"]] and recorded == [watch.verdict]
    assert said[0].startswith("hang: rank 1 (node-0) never entered gloo:all_reduce #4")
    assert json.loads((tmp_path / VERDICT).read_text())["ranks"] == [1]


def test_a_silent_rank_dumps_its_stacks_and_state_after_the_deadline(tmp_path):
    clock = PhaseClock()
    watchdog = Watchdog(clock, rank=3, dump_dir=tmp_path / "rank-3", verdict_dir=tmp_path,
                        deadline=Deadline(fixed_s=0.5), action="wait").start()
    try:
        clock.step_done(7, 0.1)
        watchdog.beat(0.1)
        clock.enter("compute")
        deadline = time.monotonic() + 30
        while not (tmp_path / "rank-3" / DUMP).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watchdog.stop()
        clock.exit("compute")
    state = json.loads((tmp_path / "rank-3" / DUMP).read_text())
    assert (state["rank"], state["last_step"], state["phase"], state["deadline_s"]) == (3, 7, "compute", 0.5)
    stacks = (tmp_path / "rank-3" / "hang-stacks.txt").read_text()
    assert stacks.startswith("Thread MainThread") and "test_a_silent_rank_dumps_its_stacks" in stacks


def test_deadline_is_a_multiple_of_the_median_step_with_a_floor():
    assert Deadline(None, factor=5, floor_s=60).seconds([]) == 60
    assert Deadline(None, factor=5, floor_s=60).seconds([20, 30, 25]) == 125
    assert Deadline(None, factor=5, floor_s=60).seconds([1, 2]) == 60
    assert Deadline(10).seconds([100]) == 10


@pytest.mark.e2e
def test_an_in_process_rank_gets_hang_detected_in_its_main_thread(tmp_path):
    """One rank run inside the launcher's process: the exception reaches the launcher, which records the end."""
    script = f"""
import time
from pathlib import Path
from primus.runtime.phases import PhaseClock
from primus.runtime.watchdog import Deadline, HangDetected, Watchdog
watchdog = Watchdog(PhaseClock(), rank=0, dump_dir=Path({str(tmp_path)!r}), verdict_dir=Path({str(tmp_path)!r}),
                    deadline=Deadline(fixed_s=0.5), in_process=True, verdict_wait_s=3).start()
watchdog.beat(0.1)
try:
    while True:
        time.sleep(0.1)
except HangDetected:
    print("HangDetected in the main thread")
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "HangDetected in the main thread" in result.stdout
