"""Where a rank's time goes: exclusive phase times, the training thread only, the slow-rank fault."""
import os
import subprocess
import sys
import threading

import pytest

from primus.runtime import faults
from primus.runtime.phases import PhaseClock, timed_iterator
from tests.helpers import ROOT


class FakeTime:
    def __init__(self):
        self.now, self.slept = 0.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_time_inside_a_nested_phase_is_charged_to_it_alone():
    t = FakeTime()
    clock = PhaseClock(now=t)
    with clock.phase("compute"):
        t.now = 3
        with clock.phase("comm"):  # a collective inside forward+backward
            t.now = 5
        t.now = 10
    t.now = 11  # outside any phase: "other"
    with clock.phase("optimizer"):
        t.now = 12
    clock.step_done(1, 12.0)
    steps, step_time, seconds = clock.take()
    assert (steps, step_time) == (1, 12.0)
    assert (seconds["compute"], seconds["comm"], seconds["optimizer"], seconds["data"]) == (8, 2, 1, 0)
    assert clock.take()[2]["compute"] == 0  # the window restarts
    assert clock.total["compute"] == 8  # the run's totals stay


def test_other_threads_are_not_this_ranks_step():
    t = FakeTime()
    clock = PhaseClock(now=t)

    def background_save():
        clock.enter("comm")
        t.now = 50
        clock.exit("comm")

    worker = threading.Thread(target=background_save)
    worker.start()
    worker.join()
    assert clock.total["comm"] == 0 and clock.current is None


def test_an_exception_closes_the_inner_phases_too():
    t = FakeTime()
    clock = PhaseClock(now=t)
    with pytest.raises(RuntimeError):
        with clock.phase("compute"):
            clock.enter("comm")  # never exited: the collective raised
            t.now = 2
            raise RuntimeError("peer lost")
    assert clock.current is None and clock.total["comm"] == 2


def test_slow_factor_stretches_forward_backward_by_a_sleep_inside_it():
    t = FakeTime()
    clock = PhaseClock(slow_factor=1.5, now=t, sleep=t.sleep)
    with clock.phase("compute"):
        t.now = 3
        with clock.phase("comm"):
            t.now = 4
        t.now = 5  # 4 s of compute, 1 s of communication
    assert t.slept == [2.0]  # (F - 1) x this forward+backward's own compute
    assert clock.total["compute"] == 6 and clock.total["comm"] == 1  # 1.5x the compute


def test_step_phases_mark_a_step_under_way():
    clock = PhaseClock()
    assert not clock.in_step
    with clock.phase("checkpoint"):
        pass
    assert not clock.in_step  # a save between steps is not the next step
    with clock.phase("data"):
        pass
    assert clock.in_step
    clock.step_done(4, 1.0)
    assert (clock.last_step, clock.in_step) == (4, False)


def test_timed_iterator_charges_each_next_to_the_data_phase():
    t = FakeTime()
    clock = PhaseClock(now=t)

    def batches():
        for i in range(3):
            t.now += 2  # loading
            yield i

    assert list(timed_iterator(batches(), clock.phase("data"))) == [0, 1, 2]
    assert clock.total["data"] == 6


def test_fault_specs(monkeypatch):
    assert faults.parse("slow@rank3:x1.5, hang@rank1:step7") == [
        faults.Fault("slow", 3, factor=1.5), faults.Fault("hang", 1, step=7)]
    for bad in ("slow@rank1:x0.5", "slow@rank1:step3", "hang@rank1:x2", "sleep@rank1:step2"):
        with pytest.raises(ValueError, match="PRIMUS_FAULT_INJECT"):
            faults.parse(bad)
    monkeypatch.setenv("PRIMUS_FAULT_INJECT", "slow@rank1:x2,hang@rank0:step3")
    assert (faults.slow_factor(1), faults.slow_factor(0), faults.hang_step(0), faults.hang_step(1)) == (2.0, None, 3,
                                                                                                      None)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # transient: a restarted worker recovers
    assert (faults.slow_factor(1), faults.hang_step(0)) == (None, None)


COLLECTIVES_SCRIPT = """
import os, tempfile
import torch, torch.distributed as dist
from primus.runtime.collectives import enable_flight_recorder, flight_record, instrumented
from primus.runtime.phases import PhaseClock
enable_flight_recorder(16)
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
original_wait = dist.distributed_c10d.Work.wait
clock = PhaseClock()
os.environ["PRIMUS_FAULT_INJECT"] = "hang@rank0:step9"
with instrumented(clock, rank=0):
    assert dist.distributed_c10d.Work.wait is not original_wait
    assert dist.ProcessGroup.allreduce.__wrapped__ is not None  # armed for the hang fault
    for _ in range(3):
        dist.all_reduce(torch.ones(1024))
    dist.all_gather_into_tensor(torch.empty(1024), torch.ones(1024))
assert dist.distributed_c10d.Work.wait is original_wait and not hasattr(dist.ProcessGroup.allreduce, "__wrapped__")
entries = flight_record()["entries"]
print("comm", clock.total["comm"] > 0, [e["profiling_name"] for e in entries], entries[-1]["collective_seq_id"])
dist.destroy_process_group()
"""


@pytest.mark.e2e
def test_collective_waits_are_timed_and_torch_records_them_also_on_gloo():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR", "TORCH_NCCL"))}
    result = subprocess.run([sys.executable, "-c", COLLECTIVES_SCRIPT], cwd=ROOT, capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == ("comm True ['gloo:all_reduce', 'gloo:all_reduce', 'gloo:all_reduce', "
                                     "'gloo:all_gather'] 4")
