"""`primus plan --project` against published GPU throughput (benchmarks/published/corpus.yaml).

    .venv/bin/python -m benchmarks.projection_published [--docs]

Each row is projected exactly as `primus plan EXP --project --device D -N nodes --nproc-per-node G`
with the row's overrides; the error is (projected - published) / published tokens/s/GPU. Writes
benchmarks/results/projection_published.json and prints the per-row table (--docs: into docs/plan.md).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

CORPUS = Path(__file__).resolve().parent / "published" / "corpus.yaml"
MAPE_TARGET, WORST_TARGET = 0.15, 0.30


def load_corpus(path: Path = CORPUS) -> list[dict[str, Any]]:
    return yaml.safe_load(path.read_text())["rows"]


def project_row(row: dict[str, Any], base: Path = CORPUS.parent) -> dict[str, Any]:
    from primus.cli.plan_project import load, profile_for
    from primus.plan.projection import project

    world = row["nodes"] * row["gpus_per_node"]
    loaded = load(str(base / row["experiment"]), list(row.get("overrides") or []), None, world, gpu=True,
                  device=row["device"])
    from dataclasses import replace

    profile = replace(profile_for(row["device"], 1), gpus_per_node=row["gpus_per_node"])
    result = project(loaded.model, loaded.layout, profile, loaded.options)
    projected = result.tokens_per_sec_per_gpu
    return {"id": row["id"], "device": row["device"], "gpus": world, "published": row["published"],
            "projected": projected, "error": (projected - row["published"]) / row["published"],
            "step_time": result.step_time, "mfu": result.mfu, "breakdown": result.breakdown,
            "source": row["source"], "out_of_model": row.get("out_of_model"),
            "layout": loaded.layout.to_dict(), "options": vars(loaded.options)}


def evaluate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    results = [project_row(row) for row in rows]
    gated = [abs(r["error"]) for r in results if not r["out_of_model"]]
    every = [abs(r["error"]) for r in results]
    return {"rows": results, "mape": statistics.mean(gated), "worst": max(gated), "gated_rows": len(gated),
            "mape_all_rows": statistics.mean(every), "worst_all_rows": max(every),
            "mape_target": MAPE_TARGET, "worst_target": WORST_TARGET}


def markdown(summary: dict[str, Any]) -> str:
    lines = ["| row | device | GPUs | published tok/s/GPU | projected | error | source |", "|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        mark = " (out of model, not gated)" if r["out_of_model"] else ""
        lines.append(f"| {r['id']}{mark} | {r['device']} | {r['gpus']} | {r['published']:,.0f} | {r['projected']:,.0f} | "
                     f"{100 * r['error']:+.1f}% | {r['source']} |")
    lines.append(f"\nMAPE {100 * summary['mape']:.1f}% (target ≤ {100 * MAPE_TARGET:.0f}%), worst "
                 f"{100 * summary['worst']:.1f}% (target ≤ {100 * WORST_TARGET:.0f}%) over {summary['gated_rows']} "
                 f"rows; with the out-of-model rows, {len(summary['rows'])} rows: MAPE "
                 f"{100 * summary['mape_all_rows']:.1f}%, worst {100 * summary['worst_all_rows']:.1f}%.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", action="store_true", help="write the table into docs/plan.md")
    args = parser.parse_args(argv)
    summary = evaluate(load_corpus())
    from benchmarks.common import save
    from benchmarks.projection_cpu import write_docs

    path = save("projection_published", summary)
    print(markdown(summary))
    if args.docs:
        write_docs(markdown(summary), "projection_published")
    print(f"results: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
