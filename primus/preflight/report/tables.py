"""The report's tables, shared by Markdown and PDF, sized for hundreds of ranks.

Up to ``MAX_ROWS`` ranks every rank gets a row. Beyond that a table shows a summary line
(min / p10 / median / max) and only the ranks worth reading: those a warn/fail finding names,
the slowest few, the first rank of each host; report.json keeps every rank.
"""
from __future__ import annotations

import statistics
from typing import Any

MAX_ROWS = 32
SLOWEST = 5
MAX_GROUP_TABLES = 8  # per collective op; more groups are summarised, worst first


def fmt_size(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def notable_ranks(report: dict[str, Any], metric: str | None = None) -> set[int]:
    """Ranks a warn/fail finding names (only findings about ``metric``, when given)."""
    return {int(r) for f in report["findings"] if f["level"] != "info"
            and (metric is None or f.get("details", {}).get("metric") == metric) for r in f["ranks"]}


def _accelerator(facts: dict[str, Any]) -> str:
    acc = facts.get("accelerators", {})
    return acc["devices"][acc["local_device"]]["name"] if acc.get("available") else "none (CPU)"


def rank_table(report: dict[str, Any]) -> tuple[str | None, list[str], list[list[Any]]]:
    headers = ["rank", "host", "local rank", "device", "accelerator"]
    ranks = {int(r): f for r, f in report["ranks"].items()}
    keep = set(ranks)
    note = None
    if len(ranks) > MAX_ROWS:
        first_per_host: dict[str, int] = {}
        for r in sorted(ranks):
            first_per_host.setdefault(ranks[r].get("identity", {}).get("host"), r)
        named = notable_ranks(report) & set(ranks)
        keep = set(sorted(named)[:MAX_ROWS]) | set(sorted(first_per_host.values())[:max(0, MAX_ROWS - len(named))])
        models: dict[str, int] = {}
        for f in ranks.values():
            models[_accelerator(f)] = models.get(_accelerator(f), 0) + 1
        note = (f"{len(ranks)} ranks on {len(first_per_host)} hosts; accelerators: "
                + ", ".join(f"{n} x {m}" for m, n in sorted(models.items(), key=lambda kv: -kv[1]))
                + f". Listed: the {len(named)} rank(s) a warn/fail finding names and the first rank of each host "
                  f"({len(keep)} rows); report.json has every rank.")
    rows = []
    for r in sorted(keep):
        ident = ranks[r].get("identity", {})
        rows.append([r, ident.get("host"), ident.get("local_rank"), ident.get("device"), _accelerator(ranks[r])])
    return note, headers, rows


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def measurement_table(report: dict[str, Any], kind: str) -> tuple[str | None, list[str], list[list[Any]]]:
    """GEMM (``gemm``) or memory bandwidth (``membw``) per rank."""
    rows = report["measurements"][kind]
    if kind == "gemm":
        headers, value_key, unit, metric = ["rank", "host", "dtype", "n", "GFLOP/s"], "gflops", "GFLOP/s", "GEMM"
        cells = lambda g: [g["rank"], g["host"], g["dtype"], g["n"], f"{g['gflops']:.1f}"]  # noqa: E731
    else:
        headers, value_key, unit, metric = ["rank", "host", "bytes", "GB/s"], "gbps", "GB/s", "memory bandwidth"
        cells = lambda b: [b["rank"], b["host"], fmt_size(b["bytes"]), f"{b['gbps']:.1f}"]  # noqa: E731
    if len(rows) <= MAX_ROWS:
        return None, headers, [cells(row) for row in rows]
    values = [row[value_key] for row in rows]
    named = notable_ranks(report, metric)
    slowest = {row["rank"] for row in sorted(rows, key=lambda row: row[value_key])[:SLOWEST]}
    kept = sorted((row for row in rows if row["rank"] in named | slowest), key=lambda row: row[value_key])[:MAX_ROWS]
    note = (f"{len(rows)} ranks: min {min(values):.1f}, p10 {_quantile(values, 0.1):.1f}, "
            f"median {statistics.median(values):.1f}, max {max(values):.1f} {unit}. Listed, slowest first: the "
            f"{SLOWEST} slowest and the ranks a warn/fail {metric} finding names (at most {MAX_ROWS}); report.json has every rank.")
    return note, headers, [cells(row) for row in kept]


def collective_tables(report: dict[str, Any]) -> list[tuple[str, list[str], list[list[Any]]]]:
    """(title, headers, rows): one table per op and group; with many groups, one per op of each
    group's peak, worst groups first."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in report["measurements"]["collectives"]:
        grouped.setdefault((row["op"], row["group"]), []).append(row)
    by_op: dict[str, list[str]] = {}
    for op, group in grouped:
        by_op.setdefault(op, []).append(group)
    out = []
    for op, groups in by_op.items():
        if len(groups) <= MAX_GROUP_TABLES:
            for group in groups:
                rows = grouped[(op, group)]
                title = f"{op} on {group} (n={rows[0]['n']}, busbw = algbw x {rows[0]['bus_factor']:.3g})"
                out.append((title, ["size", "time (us)", "algbw (GB/s)", "busbw (GB/s)"],
                            [[fmt_size(r["size"]), f"{r['seconds'] * 1e6:.1f}", f"{r['algbw_gbps']:.3f}",
                              f"{r['busbw_gbps']:.3f}"] for r in rows]))
            continue
        peaks = sorted((max(grouped[(op, g)], key=lambda r: r["busbw_gbps"]) for g in groups),
                       key=lambda r: r["busbw_gbps"])
        median = statistics.median(r["busbw_gbps"] for r in peaks)
        title = (f"{op}: {len(groups)} groups, median peak busbw {median:.2f} GB/s; the "
                 f"{MAX_GROUP_TABLES} lowest")
        out.append((title, ["group", "n", "size at peak", "peak busbw (GB/s)"],
                    [[r["group"], r["n"], fmt_size(r["size"]), f"{r['busbw_gbps']:.3f}"]
                     for r in peaks[:MAX_GROUP_TABLES]]))
    return out


def topologies(report: dict[str, Any]) -> list[tuple[list[str], str]]:
    """(hosts, text) per distinct GPU topology (``rocm-smi --showtopo`` / ``nvidia-smi topo -m``)."""
    by_text: dict[str, list[str]] = {}
    for facts in report["ranks"].values():
        text = (facts.get("accelerators") or {}).get("topology")
        host = (facts.get("identity") or {}).get("host", "?")
        if text and host not in by_text.get(text, []):
            by_text.setdefault(text, []).append(host)
    return [(hosts, text) for text, hosts in by_text.items()]


def hosts_label(hosts: list[str], limit: int = 6) -> str:
    shown = ", ".join(hosts[:limit])
    return shown + (f" and {len(hosts) - limit} more" if len(hosts) > limit else "")


def node_sections(report: dict[str, Any]) -> list[tuple[str, str | None, list[str], list[list[Any]]]]:
    """(title, note, headers, rows) of the per-node evidence and of the pairwise rounds behind its links;
    [] for a one-node job."""
    from primus.preflight.nodes import node_table

    judgment = report.get("nodes") or {}
    if len(judgment.get("nodes") or {}) < 2 or not judgment.get("medians"):
        return []
    bad = judgment["bad"]
    note = (f"Each node's slowest rank; * marks a figure below the fleet median by more than {judgment['margin']:.0%}. "
            + (f"Bad: {', '.join(bad)}. Leave them out: {judgment['exclude']}" if bad else "No bad node."))
    sections = [("Nodes", note, *node_table(judgment))]
    pairwise = judgment.get("pairwise")
    if pairwise:
        reference = pairwise.get("reference_gbps")
        rows = [[r["round"], f"{p['nodes'][0]} - {p['nodes'][1]}", f"{p['gbps']:.3g}"]
                for r in pairwise["rounds"] for p in r["pairs"]]
        note = (f"sendrecv of {fmt_size(pairwise['size'])} both ways between local rank k of each node (every k at once); "
                "round 1 pairs the nodes, later rounds pair each node of a slow pair with a healthy one"
                + (f"; round-1 median {reference:.3g} GB/s" if reference else ""))
        sections.append(("Inter-node pairs", note, ["round", "pair", "GB/s (slowest local rank)"], rows))
    return sections
