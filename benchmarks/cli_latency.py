"""CLI latency: wall time of the light ``primus`` commands vs. the bare interpreter start.

Each command is run ``reps`` times, interleaved with ``python -c pass`` so the machine's load
drift hits both; reported: median wall time, the median over ``python -c pass``, and which
heavy modules (torch, engines) each command imported (``-X importtime`` on one extra run).
Target: < 0.3 s over the interpreter start, and no torch/engine import.
"""
from __future__ import annotations

import os
import subprocess
import time
from typing import Any

from benchmarks.common import CONFIGS, PRIMUS, PY, REPO, fmt, md_table, spread

HEAVY = ("torch", "torchtitan", "megatron", "nemo_automodel", "transformers", "diffusers", "numpy", "pydantic")


def commands() -> dict[str, list[str]]:
    exp = str(CONFIGS / "torchtitan_llama_25m.yaml")
    return {
        "python -c pass": [PY, "-c", "pass"],
        "primus --help": [PRIMUS, "--help"],
        "primus config show EXP": [PRIMUS, "config", "show", exp],
        "primus config validate EXP --no-engine": [PRIMUS, "config", "validate", exp, "--no-engine"],
    }


def _wall(cmd: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start, proc.returncode


def heavy_imports(cmd: list[str]) -> list[str]:
    """Top-level heavy packages the command imported (python -X importtime)."""
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    seen = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip().split(".")[0]
            if name in HEAVY:
                seen.add(name)
    return sorted(seen)


def run(quick: bool) -> dict[str, Any]:
    reps = 5 if quick else 15
    cmds = commands()
    times: dict[str, list[float]] = {name: [] for name in cmds}
    rcs: dict[str, int] = {}
    for _ in range(reps):
        for name, cmd in cmds.items():  # interleaved: every round runs each command once
            wall, rc = _wall(cmd)
            times[name].append(wall)
            rcs[name] = rc
    base = spread(times["python -c pass"])["median"]
    rows = {}
    for name, cmd in cmds.items():
        s = spread(times[name])
        over = s["median"] - base
        rows[name] = {"wall_s": s, "over_interpreter_s": over, "rc": rcs[name],
                      "heavy_imports": heavy_imports(cmd) if name != "python -c pass" else [],
                      "target_met": name == "python -c pass" or (over < 0.3 and rcs[name] == 0)}
    return {"reps": reps, "commands": rows}


def markdown(results: dict[str, Any]) -> str:
    rows = []
    for name, r in results["commands"].items():
        s = r["wall_s"]
        rows.append([f"`{name}`", fmt(s["median"]), f"{fmt(s['min'])}–{fmt(s['max'])}",
                     fmt(r["over_interpreter_s"], "+.3f"), ", ".join(r["heavy_imports"]) or "none",
                     r["rc"], "yes" if r["target_met"] else "no"])
    return md_table(["command", "median wall (s)", "range (s)", "over `python -c pass` (s)", "heavy imports",
                     "rc", "< 0.3 s"], rows)
