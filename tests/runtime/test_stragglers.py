"""The straggler judgement: each rank's busy phases against the median of the others."""
import logging

import pytest

from primus.runtime.phases import PHASES, PhaseClock
from primus.runtime.stragglers import MIN_SHARE, Straggler, StragglerReport, find_stragglers


def figures(compute: float, comm: float = 0.1, step: float = 1.0, **others: float) -> dict[str, float]:
    row = dict.fromkeys(PHASES, 0.0)
    row.update(compute=compute, comm=comm, step=step, **others)
    return row


def test_the_rank_slow_in_a_busy_phase_is_named_not_the_ones_waiting_for_it():
    # rank 2 computes 1.5x as long; the others wait for it in communication (their step is as long)
    ranks = [figures(0.6, comm=0.35), figures(0.58, comm=0.37), figures(0.9, comm=0.05), figures(0.61, comm=0.34)]
    found = find_stragglers(ranks, threshold=0.2)
    assert [(rank, phase) for rank, phase, _ in found] == [(2, "compute")]
    assert 1.45 < found[0][2] < 1.55


def test_two_ranks_compare_with_the_other_rank_not_the_mean():
    found = find_stragglers([figures(0.4), figures(0.6)], threshold=0.2)
    assert found == [(1, "compute", pytest.approx(1.5))]  # against the pair's mean it would be 1.2: borderline


def test_below_the_threshold_or_the_noise_margin_nobody_is_named():
    assert find_stragglers([figures(0.5), figures(0.55), figures(0.52)], threshold=0.2) == []
    # a data wait 3x the others' but a tiny share of the step: noise, not a straggler
    tiny = MIN_SHARE / 4
    assert find_stragglers([figures(0.5, data=tiny / 3), figures(0.5, data=tiny)], threshold=0.2) == []
    assert find_stragglers([figures(0.5)], threshold=0.2) == []
    assert find_stragglers([figures(0.0, comm=0.0, step=0.0)] * 3, threshold=0.2) == []  # nothing timed


def test_the_worst_phase_of_each_rank_slowest_first():
    ranks = [figures(0.5, optimizer=0.2), figures(0.5, optimizer=0.2), figures(0.8, optimizer=0.5),
             figures(0.5, data=0.3)]
    found = find_stragglers(ranks, threshold=0.2)
    assert [(rank, phase) for rank, phase, _ in found] == [(3, "data"), (2, "optimizer")]
    assert found[0][2] == 0.3 / MIN_SHARE  # the others wait ~0 for data: measured against the noise margin


def test_the_line_has_its_stable_form():
    line = Straggler(5, "node-1", "compute", 1.4321, 200, 300).line
    assert line == "straggler: rank 5 (node-1) forward+backward 1.43× median over steps 200–300"


def test_rank_zero_writes_the_per_rank_figures_and_one_warning_per_straggler(caplog):
    report = StragglerReport(PhaseClock(), rank=0, world_size=3, device="cpu", interval=10, threshold=0.2)
    report.hosts = ["n0", "n0", "n1"]
    with caplog.at_level(logging.WARNING, logger="primus.stragglers"):
        events = report._judge([figures(0.5), figures(0.51), figures(0.8)], 11, 20)
    ranks, straggler = events
    assert ranks["event"] == "ranks" and ranks["steps"] == [11, 20] and ranks["hosts"] == ["n0", "n0", "n1"]
    assert ranks["compute"] == [0.5, 0.51, 0.8] and ranks["step_time"] == [1.0, 1.0, 1.0]
    assert straggler["event"] == "straggler" and (straggler["rank"], straggler["host"]) == (2, "n1")
    assert [r.getMessage() for r in caplog.records] == [straggler["line"]]
    assert straggler["line"].startswith("straggler: rank 2 (n1) forward+backward 1.58× median over steps 11–20")


def test_the_first_step_is_left_out_and_one_rank_never_gathers():
    clock = PhaseClock()
    report = StragglerReport(clock, rank=0, world_size=1, device="cpu", interval=2, threshold=0.2)
    with clock.phase("compute"):
        pass
    clock.step_done(1, 1.0)
    assert report.after_step(1) == [] and clock.window_steps == 0  # step 1 (warm-up) discarded
    clock.step_done(2, 1.0)
    assert report.after_step(2) == [] and report.first_step == 2  # one rank: nothing to compare


def test_rank_zero_coordinating_a_save_is_not_a_straggler_but_a_slow_writer_is():
    ranks = [figures(0.5, checkpoint=0.4), figures(0.5, checkpoint=0.1), figures(0.5, checkpoint=0.1),
             figures(0.5, checkpoint=0.3)]
    assert find_stragglers(ranks, threshold=0.2) == [(3, "checkpoint", pytest.approx(3.0))]


@pytest.mark.parametrize("block,message", [
    ({"stragglers": {"threshold": 0}}, "primus.stragglers.threshold=0: Input should be greater than 0"),
    ({"stragglers": {"interval": 0}}, "primus.stragglers.interval=0: Input should be greater than or equal to 1"),
    ({"hang": {"deadline_s": float("inf")}}, "primus.hang.deadline_s=inf"),
    ({"hang": {"factor": 0.5}}, "primus.hang.factor=0.5: Input should be greater than or equal to 1"),
    ({"hang": {"deadlin_s": 5}}, "unknown key 'primus.hang.deadlin_s' (did you mean 'deadline_s'?)"),
])
def test_the_options_have_ranges(block, message):
    from primus.config.errors import ConfigError
    from primus.config.provenance import Provenance
    from primus.config.schema import PrimusOptions, validate_model

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        validate_model(PrimusOptions, block, Provenance(), "primus")
    defaults = PrimusOptions()
    assert (defaults.stragglers.interval, defaults.stragglers.threshold) == (100, 0.2)
    assert (defaults.hang.deadline_s, defaults.hang.factor, defaults.hang.floor_s, defaults.hang.action) == \
        (None, 5.0, 60.0, "exit")


def test_a_rank_slow_only_in_the_optimizer_while_another_computes_slowly_is_waiting_for_it():
    # rank 0's gradient-norm all-reduce waits for rank 1 (a wait issued from C++, not timed as comm)
    ranks = [figures(0.5, optimizer=0.45), figures(0.75, optimizer=0.1)]
    assert find_stragglers(ranks, threshold=0.2) == [(1, "compute", pytest.approx(1.5))]
    # with nobody slow in data or forward+backward, a slow optimizer is the rank's own
    ranks = [figures(0.5, optimizer=0.45), figures(0.5, optimizer=0.1)]
    assert find_stragglers(ranks, threshold=0.2) == [(0, "optimizer", pytest.approx(4.5))]
