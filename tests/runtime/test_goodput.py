"""The goodput arithmetic on a run's records, by hand."""
import pytest

from primus.runtime.goodput import account, line


def step(n: int, end: float, seconds: float = 10.0) -> dict:
    return {"step": n, "loss": 1.0, "step_time": seconds, "time": end}


def test_a_restart_splits_into_restart_time_and_recomputed_steps():
    # t=0 launch; steps 1-4 end at 30..60 (10 s each); rank killed, torchelastic restarts at 65;
    # the checkpoint was at step 2: steps 3 and 4 run again, ending at 80 and 90; the attempt ends at 100
    attempt = {"wall_start": 0.0, "wall_end": 100.0, "restarts": [{"restart": 1, "time_unix": 65.0}]}
    rows = [step(1, 30), step(2, 40), step(3, 50), step(4, 60),
            {"event": "worker", "restart": 0, "checkpoint_s": 2.0, "eval_s": 0.0},  # group 0 saved step 2
            step(3, 80), step(4, 90),
            {"event": "worker", "restart": 1, "checkpoint_s": 1.0, "eval_s": 2.0},
            {"event": "straggler", "rank": 1}]
    summary = account([attempt], rows, now=1000.0)
    assert summary["total_s"] == 100
    assert summary["productive_s"] == 40  # steps 1, 2 and the kept 3, 4
    assert summary["lost_s"] == 20  # the first 3 and 4: computed again
    assert summary["startup_s"] == 20  # launch to the first step's start (30 - 10)
    assert summary["restarts_s"] == 10  # the last step before the restart ended at 60, the next began at 70
    assert (summary["checkpoint_s"], summary["eval_s"]) == (3, 2)
    assert summary["other_s"] == 5  # 100 - 40 - 20 - 20 - 10 - 3 - 2
    assert summary["goodput"] == 0.4
    assert line(summary) == ("goodput: 40.0% (productive 40.0 s of 100.0 s; start-up 20.0 s, checkpoint 3.0 s, "
                             "evaluation 2.0 s, restarts 10.0 s, lost work 20.0 s, other 5.0 s)")


def test_attempts_add_up_and_the_time_between_launches_is_not_the_jobs():
    first = {"wall_start": 0.0, "wall_end": 50.0}  # preempted after step 2, checkpoint saved
    second = {"wall_start": 1000.0, "wall_end": 1040.0}  # resumed an hour later: steps 3, 4
    rows = [step(1, 20), step(2, 30), step(3, 1020), step(4, 1030)]
    summary = account([first, second], rows, now=2000.0)
    assert summary["total_s"] == 90
    assert summary["startup_s"] == 10 + 10  # each attempt's launch to its first step
    assert (summary["productive_s"], summary["lost_s"], summary["restarts_s"]) == (40, 0, 0)
    assert summary["other_s"] == pytest.approx(90 - 40 - 20)


def test_an_attempt_that_never_trained_is_all_start_up_and_a_running_one_ends_now():
    summary = account([{"wall_start": 0.0, "wall_end": 12.0}, {"wall_start": 20.0}], [step(1, 30)], now=35.0)
    assert summary["total_s"] == 12 + 15
    assert summary["startup_s"] == 12 + 0  # the second began its first step as it started
    assert summary["goodput"] == round(10 / 27, 4)
    assert account([], [], now=1.0)["goodput"] is None
