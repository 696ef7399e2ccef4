"""Shared plumbing: run a command with the step probe, read its step times, stats, machine facts, JSON."""
from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks"
RESULTS = BENCH / "results"
CONFIGS = BENCH / "configs"
PY = sys.executable
PRIMUS = str(Path(PY).with_name("primus")) if Path(PY).with_name("primus").exists() else shutil.which("primus") or "primus"
TIMEOUT = ["timeout", "-k", "10", "600"]


def cache_root(default: str) -> Path:
    """Where Primus's experiment files put tiny assets: ``${PRIMUS_CACHE:<default>}``."""
    return Path(os.environ.get("PRIMUS_CACHE", default)).expanduser().absolute()


TT_ASSETS = cache_root(str(REPO / ".cache/primus")) / "tiny_llm"
AM_ASSETS = cache_root("~/.cache/primus") / "nemo_automodel" / "wan2_2_tiny"
# The overhead benchmark's "tiny-but-not-trivial" Wan: the tiny pipeline with these expert widths.
AM_SMALL_ASSETS = cache_root("~/.cache/primus") / "nemo_automodel" / "wan2_2_small_bench"
SMALL_WAN = dict(num_attention_heads=8, attention_head_dim=64, ffn_dim=2048, num_layers=6)


@dataclass
class ProbedRun:
    """One process tree timed by benchmarks/probe (optimizer-step ends) and by the wall clock."""

    label: str
    cmd: list[str]
    rc: int
    wall_s: float
    step_ends: list[float] = field(default_factory=list)  # perf_counter of each optimizer-step end (rank 0)
    first_step_s: float | None = None  # launch -> end of optimizer step 1 (wall clock)
    max_rss_gb: float | None = None  # peak RSS of rank 0 at its last step
    threads: list[int] = field(default_factory=list)  # rank 0's thread count at each step end
    wakeups: list[int] = field(default_factory=list)  # non-main threads' voluntary switches (BENCH_PROBE_WAKEUPS=1)
    tail: str = ""

    def step_time(self, step: int) -> float | None:
        """Optimizer step ``step`` (1-based, >= 2): the interval between the ends of steps step-1 and step."""
        return self.step_ends[step - 1] - self.step_ends[step - 2] if 2 <= step <= len(self.step_ends) else None

    def step_times(self, skip: int) -> list[float]:
        times = [b - a for a, b in zip(self.step_ends, self.step_ends[1:])]
        return times[max(0, skip - 1):]  # times[i] is step i+2; skip the first `skip` steps

    def summary(self, skip: int) -> dict[str, Any]:
        times = self.step_times(skip)
        return {"label": self.label, "rc": self.rc, "wall_s": round(self.wall_s, 3), "steps": len(self.step_ends),
                "first_step_s": self.first_step_s, "max_rss_gb": self.max_rss_gb,
                "step_time_median_s": median(times), "step_times_s": [round(t, 5) for t in times]}


def run_probed(label: str, cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path = REPO,
               verbose: bool = False) -> ProbedRun:
    probe = Path(tempfile.mkdtemp(prefix="primus-bench-probe-"))
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join([str(BENCH / "probe"), str(REPO), full_env.get("PYTHONPATH", "")])
    full_env["BENCH_PROBE_DIR"] = str(probe)
    t0_wall, t0 = time.time(), time.perf_counter()
    proc = subprocess.run([*TIMEOUT, *cmd], cwd=cwd, env=full_env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t0
    run = ProbedRun(label, cmd, proc.returncode, wall, tail="\n".join(proc.stdout.splitlines()[-15:]))
    records = []
    for path in probe.glob("steps-*.txt"):
        for line in path.read_text().splitlines():
            rank, kind, opt_id, wall_t, perf_t, rss, *extra = line.split()
            records.append((int(rank), kind, opt_id, float(wall_t), float(perf_t), int(rss),
                            int(extra[0]) if extra else 0, int(extra[1]) if len(extra) > 1 else 0))
    shutil.rmtree(probe, ignore_errors=True)
    # rank 0, torch's own optimizer class (not an engine container around it), the first one that stepped
    mine = sorted((r for r in records if r[0] == 0 and r[1].startswith("torch.optim.")), key=lambda r: r[4])
    if mine:
        first_id = mine[0][2]
        mine = [r for r in mine if r[2] == first_id]
        run.step_ends = [r[4] for r in mine]
        run.first_step_s = round(mine[0][3] - t0_wall, 3)
        run.max_rss_gb = round(mine[-1][5] / 1e6, 3)
        run.threads = [r[6] for r in mine]
        run.wakeups = [r[7] for r in mine]
    if verbose or proc.returncode != 0:
        print(f"    [{label}] rc={proc.returncode} wall={wall:.1f}s steps={len(run.step_ends)}", flush=True)
        if proc.returncode != 0:
            print("    " + run.tail.replace("\n", "\n    "), flush=True)
    return run


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def spread(values: list[float]) -> dict[str, float | None]:
    """median, quartiles, min and max: the numbers a noisy shared machine must be reported with."""
    if not values:
        return {"median": None, "p25": None, "p75": None, "min": None, "max": None, "n": 0}
    ordered = sorted(values)
    q = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else [ordered[0]] * 3
    return {"median": statistics.median(ordered), "p25": q[0], "p75": q[2], "min": ordered[0],
            "max": ordered[-1], "n": len(ordered)}


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return {"cpu": model or platform.processor(), "cores": os.cpu_count(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "loadavg_at_start": os.getloadavg(), "host": platform.node(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def save(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


def fmt(value: Any, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)


def md_table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def metrics_jsonl(run_dir: Path) -> list[dict[str, Any]]:
    """The training-step rows of a run's metrics.jsonl (validation passes and event rows left out)."""
    from primus.runtime.metrics import read_rows

    return read_rows(run_dir / "metrics.jsonl")
