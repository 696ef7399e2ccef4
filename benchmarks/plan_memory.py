"""Plan vs measured memory per rank, and the fake-world build's time.

- residuals: every layout of tests/plan/memory_cases.py built through Primus's backends on 1, 2 or 4 CPU
  ranks, one step, each rank's weights / gradients / optimizer state / activations counted from its tensors,
  beside ``primus plan``'s figure for that rank (the table in docs/plan.md);
- fake world: ``primus plan --build`` of the 70B examples at 512 ranks (TP 8 x PP 8 x DP 8), CPU and wall
  seconds (target: 60 s).

    .venv/bin/python -m benchmarks.plan_memory [--quick]     # --quick: the fake-world timings only
"""
from __future__ import annotations

import argparse
import resource
import subprocess
import time
from typing import Any

from benchmarks.common import PRIMUS, REPO, fmt, md_table, save
from tests.plan.memory_cases import CASES, STATIC, measure, planned, residuals, scratch

FAKE_WORLD = {
    "megatron 70B": ["examples/megatron/llama3.1_70B-pretrain.yaml", "pipeline_model_parallel_size=8",
                     "num_layers_per_virtual_pipeline_stage=null", "global_batch_size=512"],
    "torchtitan 70B": ["examples/torchtitan/llama3.1_70B-pretrain.yaml", "parallelism.pipeline_parallel_degree=8",
                       "parallelism.data_parallel_shard_degree=8"],
}
FAKE_WORLD_TARGET_S = 60


def fake_world_times() -> dict[str, Any]:
    rows = {}
    for name, (exp, *layout) in FAKE_WORLD.items():
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        out = subprocess.run([PRIMUS, "plan", str(REPO / exp), "--nproc-per-node", "8", "-N", "64", *layout, "--build"],
                             cwd=REPO, capture_output=True, text=True, timeout=1800)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        rows[name] = {"rc": out.returncode, "wall_s": wall, "cpu_s": cpu, "agrees": "plan differs" not in out.stdout,
                      "target_met": out.returncode == 0 and cpu <= FAKE_WORLD_TARGET_S}
    return rows


def residual_rows() -> list[dict[str, Any]]:
    out = scratch()
    assets = out / "cache" / "tiny_llm"
    results = measure(list(CASES), out, assets)
    rows = []
    for case in CASES:
        for row in residuals(case, planned(case, assets), results[case.name]):
            rows.append({"case": row.case, "rank": row.rank, "component": row.component, "planned": row.planned,
                         "measured": row.measured, "relative": row.relative})
    return rows


def run(quick: bool) -> dict[str, Any]:
    return {"fake_world": fake_world_times(), "residuals": [] if quick else residual_rows()}


def markdown(results: dict[str, Any]) -> str:
    parts = []
    if results["residuals"]:
        table: dict[str, dict[str, list]] = {}
        for row in results["residuals"]:
            table.setdefault(row["case"], {}).setdefault(row["component"], []).append(row)
        lines = []
        for case, components in table.items():
            ranks = max(len(rows) for rows in components.values())
            cells = [f"`{case}`", ranks]
            for component in (*STATIC, "activations"):
                rows = components[component]
                worst = max(rows, key=lambda r: abs(r["relative"]))
                exact = all(r["planned"] == r["measured"] for r in rows)
                cells.append(f"{worst['measured']:,} / {worst['planned']:,} "
                             f"({'exact' if exact else format(worst['relative'], '+.1%')})")
            lines.append(cells)
        parts.append(md_table(["layout", "ranks", "weights: measured / plan", "grads", "optimizer",
                               "activations"], lines))
    fake = [[name, r["rc"], fmt(r["cpu_s"], ".1f"), fmt(r["wall_s"], ".1f"), "yes" if r["agrees"] else "no",
             "yes" if r["target_met"] else "no"] for name, r in results["fake_world"].items()]
    parts.append(md_table(["`plan --build`, 512 ranks", "rc", "CPU (s)", "wall (s)", "bytes = plan's",
                           f"CPU <= {FAKE_WORLD_TARGET_S} s"], fake))
    return "\n\n".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the fake-world timings only")
    args = parser.parse_args()
    results = run(args.quick)
    save("plan_memory", results)
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
