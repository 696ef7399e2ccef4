"""The projection ranks real CPU runs as they measure: three layouts of the 25M preset on both LLM
backends, this host's `local` profile measured first (benchmarks/projection_cpu.py runs the full set and
reports MAPE and Kendall's tau)."""
from __future__ import annotations

import os

import pytest

from benchmarks.projection_cpu import MG, TT, kendall_tau, project_layout
from primus.plan.profiles import write_local_profile

LAYOUTS = [  # well apart on purpose (1x, 2x, 4x the tokens): the ranking, not the noise, is under test
    ("megatron mbs1", MG, ["micro_batch_size=1", "global_batch_size=1"]),
    ("torchtitan mbs2", TT, ["training.local_batch_size=2"]),
    ("megatron mbs4", MG, ["micro_batch_size=4", "global_batch_size=4"]),
]


def test_kendall_tau():
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == 1.0
    assert kendall_tau([1, 2, 3], [30, 20, 10]) == -1.0
    assert kendall_tau([1, 2, 3], [10, 30, 20]) == pytest.approx(1 / 3)


@pytest.mark.e2e
def test_projected_order_is_the_measured_order(tmp_path, monkeypatch):
    pytest.importorskip("megatron.core")
    import subprocess

    from primus.preflight.perf.profile import measure_local_profile
    from tests.conftest import PRIMUS, ROOT
    from tests.helpers import read_metrics

    monkeypatch.setenv("PRIMUS_PROFILE_CACHE", str(tmp_path / "profiles"))
    write_local_profile(measure_local_profile("cpu", "cpu"))
    projected, measured = [], []
    for name, exp, overrides in LAYOUTS:
        steps = "training.steps=6" if exp == TT else "train_iters=6"
        run = subprocess.run([*PRIMUS, "train", exp, f"workspace={tmp_path}", f"exp_name={name.replace(' ', '_')}",
                              steps, "primus.save_last_checkpoint=false", *overrides], cwd=ROOT,
                             env={**os.environ, "PRIMUS_PROFILE_CACHE": str(tmp_path / "profiles")},
                             capture_output=True, text=True, timeout=1200)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        assert "projected vs measured (local profile)" in run.stdout + run.stderr  # the run's own summary line
        metrics = read_metrics(next(tmp_path.glob(f"*/*/{name.replace(' ', '_')}/metrics.jsonl")).parent)
        # the fastest step: load from the other tests only ever slows a step (as preflight's best-of GEMM probe)
        measured.append(min(row["step_time"] for row in metrics[2:]))
        projected.append(project_layout(exp, 1, overrides)["step_time"])
    assert kendall_tau(projected, measured) == 1.0, (projected, measured)


def test_reproject_with_no_host_cost_gives_the_stored_projection(tmp_path, monkeypatch):
    """--reproject re-runs only the model: with the host-op costs at zero it reproduces what was stored."""
    import json

    from benchmarks.projection_cpu import reproject
    from primus.preflight.perf import profile

    from benchmarks.common import REPO

    stored = json.loads((REPO / "benchmarks" / "results" / "projection_cpu.json").read_text())
    stored["points"] = stored["points"][:1]
    path = tmp_path / "one.json"
    path.write_text(json.dumps(stored))
    monkeypatch.setattr(profile, "op_dispatch_s", lambda *a, **k: 0.0)
    monkeypatch.setattr(profile, "dtensor_op_s", lambda *a, **k: (0.0, "zero"))
    point = reproject(path)["points"][0]
    assert point["step_time"] == pytest.approx(point["before"]["step_time"], rel=1e-12)
    assert point["measured"] == stored["points"][0]["measured"]
