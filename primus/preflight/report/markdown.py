"""The report as Markdown (tables; plots linked as PNG files next to it)."""
from __future__ import annotations

from typing import Any

import yaml

from primus.preflight.report.tables import (collective_tables, hosts_label, measurement_table, node_sections, rank_table,
                                           topologies)


def table(headers: list[str], rows: list[list[Any]]) -> str:
    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _table_with_note(note: str | None, headers: list[str], rows: list[list[Any]]) -> list[str]:
    return ([note] if note else []) + [table(headers, rows)]


def render_markdown(report: dict[str, Any], images: dict[str, str]) -> str:
    world = report["world"]
    hosts = sorted(set(world["hosts"].values()))
    parts = [
        f"# Primus preflight: {report['status'].upper()}",
        f"{report['created']} | world size {world['world_size']} | {len(world['joined'])} rank(s) joined | "
        f"{len(hosts)} host(s): {hosts_label(hosts) or 'none'} | device {world['device']} | exit status {report['exit_code']} "
        f"({report['counts']['fail']} fail, {report['counts']['warn']} warn, {report['counts']['info']} info)",
        "## Findings",
        table(["level", "check", "message", "ranks"],
              [[f["level"].upper(), f["check"], f["message"], ",".join(map(str, f["ranks"]))] for f in report["findings"]]),
    ]
    for title, note, headers, rows in node_sections(report):
        parts += [f"## {title}", *_table_with_note(note, headers, rows)]
    parts += ["## Ranks", *_table_with_note(*rank_table(report))]
    for hosts, text in topologies(report):
        parts += [f"## GPU topology: {hosts_label(hosts)}", "```\n" + text + "\n```"]
    m = report["measurements"]
    if m["gemm"]:
        parts += ["## GEMM", *_table_with_note(*measurement_table(report, "gemm"))]
        if "gemm" in images:
            parts.append(f"![GEMM per rank]({images['gemm']})")
    if m["membw"]:
        parts += ["## Memory bandwidth", *_table_with_note(*measurement_table(report, "membw"))]
    if m["collectives"]:
        parts.append("## Collectives")
        parts.append("busbw formulas (nccl-tests): " + "; ".join(f"{op}: {f}" for op, f in report["formulas"]["busbw"].items()))
        if "busbw" in images:
            parts.append(f"![bus bandwidth vs message size]({images['busbw']})")
        for title, headers, rows in collective_tables(report):
            parts += [f"### {title}", table(headers, rows)]
    parts += ["## Thresholds", "```yaml\n" + yaml.safe_dump(report["thresholds"], sort_keys=False).strip() + "\n```"]
    return "\n\n".join(parts) + "\n"
