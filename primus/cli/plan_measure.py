"""``primus plan --search --measure K``: train the top K layouts for a few steps here, re-rank by measurement.

Each layout runs through ``primus train`` (its own process tree, a throw-away workspace, no checkpoint);
its median step time (steps after the first two) is read from the run's ``metrics.jsonl``. A layout that
fails to run is kept, marked failed, and ranked last.
"""
from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from primus.backends.projection import backend_projection
from primus.config.errors import ConfigError
from primus.runtime.rundir import RunDir

SKIP_STEPS = 2


def measure_rows(exp: str, overrides: list[str], framework: str, result, *, nodes: int, gpus_per_node: int,
                 top: int, steps: int, timeout_s: float = 1800.0) -> None:
    """Measure ``result.rows[:top]`` in place and re-rank ``result.rows`` by measured step time."""
    if nodes != 1:
        raise ConfigError(f"--measure runs the layouts on this machine: it needs --nodes 1 (got {nodes})")
    if steps <= SKIP_STEPS:
        raise ConfigError(f"--measure-steps must be more than {SKIP_STEPS} (the first steps warm up), got {steps}")
    steps_key = backend_projection(framework).STEPS_KEY
    workspace = Path(tempfile.mkdtemp(prefix="primus-plan-measure-"))
    try:
        for i, row in enumerate(result.rows[:top]):
            name = f"measure{i}"
            cmd = [sys.executable, "-m", "primus.cli.main", "train", exp, *overrides, *row.overrides,
                   f"{steps_key}={steps}", f"workspace={workspace}", f"exp_name={name}",
                   "primus.save_last_checkpoint=false", "--nproc-per-node", str(gpus_per_node), "--no-resume"]
            print(f"measuring layout {i + 1}/{min(top, len(result.rows))}: {' '.join(row.overrides)}", file=sys.stderr)
            try:
                done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                      timeout=timeout_s)
            except subprocess.TimeoutExpired:
                row.measure_error = f"no result within {timeout_s:.0f} s"
                continue
            if done.returncode == 0:
                row.measured_step_time = _median_step(next(workspace.glob(f"*/*/{name}/{RunDir.METRICS}"), None))
            else:
                lines = [line for line in done.stderr.splitlines() if line.strip()]
                row.measure_error = f"exit {done.returncode}: {lines[-1] if lines else ''}"[:300]
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    measured = result.rows[:top]
    measured.sort(key=lambda r: (r.measured_step_time is None, r.measured_step_time or 0.0))
    result.rows[:top] = measured


def _median_step(path: Path | None) -> float | None:
    if path is None or not path.exists():
        return None
    from primus.runtime.metrics import read_rows

    times = [row["step_time"] for row in read_rows(path)]
    return statistics.median(times[SKIP_STEPS:]) if len(times) > SKIP_STEPS else None
