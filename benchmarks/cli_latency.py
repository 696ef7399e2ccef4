"""CLI latency: wall time of the light ``primus`` commands vs. the bare interpreter start.

Each command is run ``reps`` times, interleaved with ``python -c pass`` so the machine's load
drift hits both; reported: median wall time, the median over ``python -c pass``, and which
heavy modules (torch, engines) each command imported (``-X importtime`` on one extra run).
Target: < 0.3 s over the interpreter start, and no torch/engine import; ``primus plan`` (a Megatron and a
TorchTitan example): under 1 s of CPU, no engine import. CPU seconds (user + system of the child) are
reported beside the wall time: on a shared machine they are the steadier number.
"""
from __future__ import annotations

import os
import resource
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
        "primus plan MEGATRON_8B --nproc-per-node 8": [PRIMUS, "plan", str(REPO / "examples/megatron/llama3.1_8B-pretrain.yaml"),
                                                       "--nproc-per-node", "8"],
        "primus plan TORCHTITAN_70B --nproc-per-node 8": [PRIMUS, "plan",
                                                          str(REPO / "examples/torchtitan/llama3.1_70B-pretrain.yaml"),
                                                          "--nproc-per-node", "8"],
    }


PLAN_CPU_TARGET_S = 1.0  # issue: `plan` under 1 s of CPU per call


def _wall(cmd: list[str]) -> tuple[float, int, float]:
    """(wall seconds, exit status, CPU seconds of the child: user + system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, proc.returncode, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


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
    cpu: dict[str, list[float]] = {name: [] for name in cmds}
    rcs: dict[str, int] = {}
    for _ in range(reps):
        for name, cmd in cmds.items():  # interleaved: every round runs each command once
            wall, rc, seconds = _wall(cmd)
            times[name].append(wall)
            cpu[name].append(seconds)
            rcs[name] = rc
    base = spread(times["python -c pass"])["median"]
    rows = {}
    for name, cmd in cmds.items():
        s = spread(times[name])
        over = s["median"] - base
        cpu_s = spread(cpu[name])["median"]
        met = over < 0.3 if not name.startswith("primus plan") else cpu_s < PLAN_CPU_TARGET_S
        rows[name] = {"wall_s": s, "cpu_s": spread(cpu[name]), "over_interpreter_s": over, "rc": rcs[name],
                      "heavy_imports": heavy_imports(cmd) if name != "python -c pass" else [],
                      "target_met": name == "python -c pass" or (met and rcs[name] == 0)}
    return {"reps": reps, "commands": rows}


def markdown(results: dict[str, Any]) -> str:
    rows = []
    for name, r in results["commands"].items():
        s = r["wall_s"]
        rows.append([f"`{name}`", fmt(s["median"]), f"{fmt(s['min'])}–{fmt(s['max'])}",
                     fmt(r["over_interpreter_s"], "+.3f"), fmt((r.get("cpu_s") or {}).get("median")),
                     ", ".join(r["heavy_imports"]) or "none", r["rc"], "yes" if r["target_met"] else "no"])
    return md_table(["command", "median wall (s)", "range (s)", "over `python -c pass` (s)", "median CPU (s)",
                     "heavy imports", "rc", "target (< 0.3 s over; plan < 1 s CPU)"], rows)
