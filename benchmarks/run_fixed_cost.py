"""The fixed cost of a tiny CPU ``primus train`` run per engine (1 and 2 ranks): wall and CPU seconds of the whole
command, and where the wall time goes, for this tree and a baseline commit, side by side.

The baseline is a detached ``git worktree`` of ``--baseline`` (default ``main``) in a temporary folder, run with
the same interpreter and the same cached tiny assets; the two trees alternate within each round, so load
drift hits both; one unrecorded run per case first builds the tiny assets. CPU is the command's and all its descendants' user+system time (``RUSAGE_CHILDREN``: the
launcher, torchrun's agent, every rank). Phases, from the wall clock and rank 0's ``debug.log`` timestamps:

- ``to first rank line``: launch -> rank 0's first log line (CLI, planning, torchrun, the rank's imports);
- ``to step 1``: -> the end of optimizer step 1 (``[TRAIN] step=1``: build, data, the first step);
- ``steps``: step 1 -> the last step's line;
- ``after last step``: -> the command's exit (last checkpoint, the engine's ending, teardown, goodput, plot).

``python -m benchmarks.run_fixed_cost [--reps N] [--baseline REF] [--cases torchtitan-1,megatron-2]``;
JSON in benchmarks/results/run_fixed_cost.json.
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.common import PY, REPO, TIMEOUT, fmt, machine, md_table, save, spread

CASES = {  # name -> (example, overrides, ranks): 5 steps each, the fixed cost dominating as in the test suite
    "torchtitan-1": ("examples/torchtitan/llama3_tiny-pretrain.yaml", ["training.steps=5"], 1),
    "torchtitan-2": ("examples/torchtitan/llama3_tiny-pretrain.yaml", ["training.steps=5"], 2),
    "megatron-1": ("examples/megatron/llama3_tiny-pretrain.yaml", ["train_iters=5"], 1),
    "megatron-2": ("examples/megatron/llama3_tiny-pretrain.yaml", ["train_iters=5"], 2),
    "automodel-1": ("examples/nemo_automodel/llama3_tiny-sft-lora.yaml", ["step_scheduler.max_steps=5"], 1),
    "automodel-2": ("examples/nemo_automodel/llama3_tiny-sft-lora.yaml",  # global batch 8 = 4 x 2 ranks
                    ["step_scheduler.max_steps=5", "step_scheduler.local_batch_size=4"], 2),
}
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d) ")


def _stamps(debug_log: Path) -> tuple[float | None, float | None, float | None]:
    """(first line, first [TRAIN] step line, last step line) of a rank's debug.log, as epoch seconds."""
    first = step1 = last_step = None
    if not debug_log.is_file():
        return None, None, None
    for line in debug_log.read_text(errors="replace").splitlines():
        match = STAMP.match(line)
        if not match:
            continue
        when = datetime.fromisoformat(match.group(1)).timestamp()
        first = first or when
        if "[TRAIN] step=" in line:
            step1 = step1 or when
            last_step = when
    return first, step1, last_step


def run_once(tree: Path, case: str, cache: Path) -> dict[str, Any]:
    example, overrides, ranks = CASES[case]
    workspace = Path(tempfile.mkdtemp(prefix="primus-fixed-cost-"))
    env = {**os.environ, "PYTHONPATH": str(tree), "PRIMUS_CACHE": str(cache), "PRIMUS_WORKSPACE": str(workspace),
           "PRIMUS_EXP_NAME": "fixed"}
    cmd = [*TIMEOUT, PY, "-m", "primus.cli.main", "train", example, *overrides, "--nproc-per-node", str(ranks)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    launched, start = time.time(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    logs = next(workspace.rglob("logs"), None)
    first, step1, last_step = _stamps(logs / "pre_trainer" / "rank-0" / "debug.log") if logs else (None,) * 3
    ended = launched + wall
    shutil.rmtree(workspace, ignore_errors=True)
    if proc.returncode != 0:
        print(f"    [{case} @ {tree}] rc={proc.returncode}\n    " + proc.stderr[-1500:].replace("\n", "\n    "))
    return {"rc": proc.returncode, "wall_s": wall,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "phases": {"to first rank line": first and first - launched, "to step 1": step1 and first and step1 - first,
                       "steps": last_step and step1 and last_step - step1,
                       "after last step": last_step and ended - last_step}}


def _baseline_tree(ref: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix="primus-baseline-"))
    path.rmdir()
    subprocess.run(["git", "worktree", "add", "--detach", str(path), ref], cwd=REPO, check=True, capture_output=True)
    return path


def run(reps: int, baseline: str, cases: list[str], warmup: bool = True) -> dict[str, Any]:
    cache = Path(os.environ.get("PRIMUS_CACHE", REPO / ".cache/primus")).expanduser().absolute()
    base = _baseline_tree(baseline)
    commit = subprocess.run(["git", "rev-parse", "--short", baseline], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    trees = {f"before ({baseline} {commit})": base, "after (this tree)": REPO}
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {case: {name: [] for name in trees} for case in cases}
    try:
        for case in cases if warmup else []:  # first use builds the tiny assets into the cache: no sample
            run_once(REPO, case, cache)
        for round_ in range(reps):
            for case in cases:
                for name, tree in trees.items():
                    sample = run_once(tree, case, cache)
                    samples[case][name].append(sample)
                    print(f"  round {round_ + 1} {case:13s} {name:28s} wall {sample['wall_s']:6.2f} s  "
                          f"CPU {sample['cpu_s']:6.2f} s  rc {sample['rc']}", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO, capture_output=True)
    rows: dict[str, Any] = {}
    for case in cases:
        rows[case] = {}
        for name in trees:
            ok = [s for s in samples[case][name] if s["rc"] == 0]
            phases = {phase: spread([s["phases"][phase] for s in ok if s["phases"][phase] is not None])
                      for phase in ("to first rank line", "to step 1", "steps", "after last step")}
            rows[case][name] = {"wall_s": spread([s["wall_s"] for s in ok]), "cpu_s": spread([s["cpu_s"] for s in ok]),
                                "phases": phases, "failed": len(samples[case][name]) - len(ok)}
        before, after = (rows[case][name] for name in trees)
        rows[case]["saved"] = {key: _difference(before[key]["median"], after[key]["median"])
                               for key in ("wall_s", "cpu_s")}
    return {"reps": reps, "baseline": f"{baseline} {commit}", "machine": machine(), "cases": rows,
            "samples": samples}


def _difference(before: float | None, after: float | None) -> dict[str, float | None]:
    if before is None or after is None:
        return {"seconds": None, "ratio_before_over_after": None}
    return {"seconds": before - after, "ratio_before_over_after": before / after if after else None}


def markdown(results: dict[str, Any]) -> str:
    table = []
    for case, by_tree in results["cases"].items():
        for name, row in by_tree.items():
            if name == "saved":
                continue
            phases = row["phases"]
            table.append([case, name, fmt(row["wall_s"]["median"], ".2f"), fmt(row["cpu_s"]["median"], ".2f"),
                          *(fmt(phases[p]["median"], ".2f") for p in phases)])
        saved = by_tree["saved"]
        table.append([case, "**saved (before / after)**", f"{fmt(saved['wall_s']['seconds'], '.2f')} "
                      f"({fmt(saved['wall_s']['ratio_before_over_after'], '.2f')}x)",
                      f"{fmt(saved['cpu_s']['seconds'], '.2f')} ({fmt(saved['cpu_s']['ratio_before_over_after'], '.2f')}x)",
                      "", "", "", ""])
    return md_table(["run", "tree", "wall (s)", "CPU (s)", "to first rank line", "to step 1", "steps",
                     "after last step"], table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--baseline", default="main", help="the commit to compare with (a git ref)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--no-warmup", action="store_true", help="the cache holds every case's tiny assets already")
    parser.add_argument("--name", default="run_fixed_cost", help="the results file's name")
    args = parser.parse_args()
    results = run(args.reps, args.baseline, args.cases.split(","), warmup=not args.no_warmup)
    print(markdown(results))
    print(f"results: {save(args.name, results)}")


if __name__ == "__main__":
    main()
