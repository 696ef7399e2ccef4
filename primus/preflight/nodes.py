"""Which nodes to leave out: each node's figures against the fleet's median, and the Slurm exclude list.

A node's figures are its slowest rank's GEMM and memory bandwidth, its intra-node all-reduce bus
bandwidth, and its inter-node link (``perf/pairwise.py``: its bandwidth paired with a healthy node).
A node whose figure is below the median of the nodes by more than ``nodes.margin`` (thresholds.yaml)
(for the link: a node the bisection found slow beside a healthy partner) is named, with the evidence
table behind it, and the named nodes become ``--exclude=a,b`` for sbatch / srun. A fleet with fewer
than 4 nodes cannot pin a slow link on one node: said, not guessed.
"""
from __future__ import annotations

import statistics
from typing import Any

from primus.preflight.findings import Finding, fail, info, warn

METRICS = (  # key, label, unit
    ("gemm", "GEMM", "GFLOP/s"),
    ("membw", "memory bandwidth", "GB/s"),
    ("intra", "intra-node all-reduce busbw", "GB/s"),
    ("link", "inter-node link", "GB/s"),
)


def _intra_busbw(collectives: list[dict[str, Any]]) -> dict[str, float]:
    """Per node: the intra-node all-reduce bus bandwidth at its largest size."""
    best: dict[str, dict[str, Any]] = {}
    for row in collectives:
        if row["op"] == "allreduce" and row["group"].startswith("intra:"):
            node = row["group"].split(":", 1)[1]
            if row["size"] >= best.get(node, {"size": -1})["size"]:
                best[node] = row
    return {node: row["busbw_gbps"] for node, row in best.items()}


def node_figures(measurements: dict[str, Any], hosts: dict[int, str], pairwise: dict[str, Any] | None) -> dict[str, dict]:
    """Node -> {ranks, gemm, membw, intra, link, link_partner}: what is known of each node."""
    nodes: dict[str, dict[str, Any]] = {}
    for rank in sorted(hosts):
        nodes.setdefault(hosts[rank], {"ranks": []})["ranks"].append(rank)
    for key, field in (("gemm", "gflops"), ("membw", "gbps")):
        for row in measurements.get(key, []):
            node = nodes.get(hosts.get(row["rank"]))
            if node is not None:
                node[key] = min(node.get(key, float("inf")), row[field])
    for node, value in _intra_busbw(measurements.get("collectives", [])).items():
        if node in nodes:
            nodes[node]["intra"] = value
    for node, figure in ((pairwise or {}).get("figures") or {}).items():
        if node in nodes:
            nodes[node].update(link=figure["gbps"], link_partner=figure["partner"])
    return nodes


def judge_nodes(measurements: dict[str, Any], hosts: dict[int, str], pairwise: dict[str, Any] | None,
                thresholds: dict[str, Any]) -> dict[str, Any]:
    """The evidence: every node's figures, the fleet medians, and the nodes below them by the margin."""
    margin = float(thresholds["nodes"]["margin"])
    nodes = node_figures(measurements, hosts, pairwise)
    medians, below = {}, {}
    for key, _, _ in METRICS:
        values = {name: node[key] for name, node in nodes.items() if key in node}
        if len(values) < (4 if key == "link" else 2):
            continue
        medians[key] = statistics.median(values.values())
        if key == "link" and "bad" in (pairwise or {}):  # the bisection's verdict: slow beside a healthy node
            slow_nodes = [name for name in values if name in pairwise["bad"]]
        else:
            slow_nodes = [name for name, value in values.items()
                          if medians[key] > 0 and value < medians[key] * (1 - margin)]
        for name in slow_nodes:
            below.setdefault(name, []).append(key)
    bad = [name for name in nodes if name in below]
    return {"margin": margin, "medians": medians, "nodes": nodes, "below": below, "bad": bad,
            "exclude": f"--exclude={','.join(bad)}" if bad else None,
            "pairwise": pairwise}


def node_findings(judgment: dict[str, Any], *, fail_on_bad: bool = True) -> list[Finding]:
    nodes, medians, margin = judgment["nodes"], judgment["medians"], judgment["margin"]
    found: list[Finding] = []
    make = fail if fail_on_bad else warn
    for name in judgment["bad"]:
        evidence = []
        for key, label, unit in METRICS:
            if key in judgment["below"][name]:
                value, median = nodes[name][key], medians[key]
                partner = f" (paired with {nodes[name]['link_partner']})" if key == "link" else ""
                evidence.append(f"{label} {value:.3g} {unit}{partner} is {value / median:.0%} of the fleet median "
                                f"{median:.3g} {unit}")
        found.append(make("nodes", f"bad node {name}: {'; '.join(evidence)} (margin {margin:.0%})",
                          nodes[name]["ranks"], node=name, metrics=judgment["below"][name]))
    if judgment["bad"]:
        found.append(info("nodes", f"leave them out: sbatch/srun {judgment['exclude']}", exclude=judgment["exclude"]))
    elif len(nodes) > 1 and medians:
        found.append(info("nodes", f"all {len(nodes)} nodes within {margin:.0%} of the fleet median "
                          f"({', '.join(label for key, label, _ in METRICS if key in medians)})"))
    if 1 < len(nodes) < 4 and judgment.get("pairwise"):
        found.append(info("nodes", f"{len(nodes)} nodes: a slow inter-node link cannot be pinned on one node "
                          "(that needs at least 4: two pairs to compare)"))
    return found


def node_table(judgment: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """The evidence table: one row per node, its figures and verdict (Markdown and PDF)."""
    keys = [(key, label, unit) for key, label, unit in METRICS if key in judgment["medians"]]
    headers = ["node", "ranks", *[f"{label} ({unit})" for _, label, unit in keys], "verdict"]
    rows = []
    for name, node in judgment["nodes"].items():
        cells = [name, _ranks(node["ranks"])]
        for key, _, _ in keys:
            value = node.get(key)
            mark = " *" if key in judgment["below"].get(name, []) else ""
            partner = f" w/ {node['link_partner']}" if key == "link" and value is not None else ""
            cells.append("-" if value is None else f"{value:.3g}{partner}{mark}")
        cells.append("BAD" if name in judgment["bad"] else "ok")
        rows.append(cells)
    rows.append(["fleet median", "", *[f"{judgment['medians'][key]:.3g}" for key, _, _ in keys], ""])
    return headers, rows


def _ranks(ranks: list[int]) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)) \
        else ",".join(map(str, ranks))
