"""The report as Markdown (tables; plots linked as PNG files next to it)."""
from __future__ import annotations

from typing import Any

import yaml


def fmt_size(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def table(headers: list[str], rows: list[list[Any]]) -> str:
    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def rank_rows(report: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for r, facts in report["ranks"].items():
        ident, acc = facts.get("identity", {}), facts.get("accelerators", {})
        name = acc["devices"][acc["local_device"]]["name"] if acc.get("available") else "none (CPU)"
        rows.append([r, ident.get("host"), ident.get("local_rank"), ident.get("device"), name])
    return rows


def collective_tables(report: dict[str, Any]) -> list[tuple[str, list[str], list[list[Any]]]]:
    """(title, headers, rows) per op and group, shared by Markdown and PDF."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in report["measurements"]["collectives"]:
        grouped.setdefault((row["op"], row["group"]), []).append(row)
    out = []
    for (op, group), rows in grouped.items():
        title = f"{op} on {group} (n={rows[0]['n']}, busbw = algbw x {rows[0]['bus_factor']:.3g})"
        out.append((title, ["size", "time (us)", "algbw (GB/s)", "busbw (GB/s)"],
                    [[fmt_size(r["size"]), f"{r['seconds'] * 1e6:.1f}", f"{r['algbw_gbps']:.3f}",
                      f"{r['busbw_gbps']:.3f}"] for r in rows]))
    return out


def render_markdown(report: dict[str, Any], images: dict[str, str]) -> str:
    world = report["world"]
    hosts = sorted(set(world["hosts"].values()))
    parts = [
        f"# Primus preflight: {report['status'].upper()}",
        f"{report['created']} | world size {world['world_size']} | {len(world['joined'])} rank(s) joined | "
        f"hosts: {', '.join(hosts) or 'none'} | device {world['device']} | exit status {report['exit_code']} "
        f"({report['counts']['fail']} fail, {report['counts']['warn']} warn, {report['counts']['info']} info)",
        "## Findings",
        table(["level", "check", "message", "ranks"],
              [[f["level"].upper(), f["check"], f["message"], ",".join(map(str, f["ranks"]))] for f in report["findings"]]),
        "## Ranks",
        table(["rank", "host", "local rank", "device", "accelerator"], rank_rows(report)),
    ]
    m = report["measurements"]
    if m["gemm"]:
        parts += ["## GEMM", table(["rank", "host", "dtype", "n", "GFLOP/s"],
                                   [[g["rank"], g["host"], g["dtype"], g["n"], f"{g['gflops']:.1f}"] for g in m["gemm"]])]
        if "gemm" in images:
            parts.append(f"![GEMM per rank]({images['gemm']})")
    if m["membw"]:
        parts += ["## Memory bandwidth", table(["rank", "host", "bytes", "GB/s"],
                                               [[b["rank"], b["host"], fmt_size(b["bytes"]), f"{b['gbps']:.1f}"] for b in m["membw"]])]
    if m["collectives"]:
        parts.append("## Collectives")
        parts.append("busbw formulas (nccl-tests): " + "; ".join(f"{op}: {f}" for op, f in report["formulas"]["busbw"].items()))
        if "busbw" in images:
            parts.append(f"![bus bandwidth vs message size]({images['busbw']})")
        for title, headers, rows in collective_tables(report):
            parts += [f"### {title}", table(headers, rows)]
    parts += ["## Thresholds", "```yaml\n" + yaml.safe_dump(report["thresholds"], sort_keys=False).strip() + "\n```"]
    return "\n\n".join(parts) + "\n"
