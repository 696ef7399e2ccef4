"""Name the ranks whose GEMM, memory bandwidth or link is far below their peers' median.

A slow rank sets the pace of every synchronous step, so one bad GPU or cable costs the
whole job. For links the per-rank value is each rank's own sendrecv-ring bandwidth at the
largest size: a slow link lowers both of its ends, so expect two adjacent ranks named.
"""
from __future__ import annotations

import statistics
from typing import Any

from primus.preflight.findings import Finding, fail, warn


def find_stragglers(what: str, values: dict[int, float], hosts: dict[int, str], thresholds: dict[str, Any],
                    unit: str) -> list[Finding]:
    if len(values) < 2:
        return []
    median = statistics.median(values.values())
    if median <= 0:
        return []
    warn_at = thresholds["performance"]["straggler_warn_fraction"]
    fail_at = thresholds["performance"]["straggler_fail_fraction"]
    found = []
    for rank, value in sorted(values.items()):
        ratio = value / median
        if ratio >= warn_at:
            continue
        level = fail if ratio < fail_at else warn
        found.append(level("performance", f"straggler: rank {rank} ({hosts.get(rank, 'host unknown')}) {what} "
                           f"{value:.3g} {unit} is {ratio:.0%} of the median {median:.3g} {unit}", [rank],
                           metric=what, value=value, median=median, ratio=ratio))
    return found


def link_values(rows: list[dict[str, Any]]) -> dict[int, float]:
    """Per-rank GB/s from sendrecv rows at each group's largest size."""
    values: dict[int, float] = {}
    by_group: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["op"] == "sendrecv" and row["size"] >= by_group.get(row["group"], {"size": -1})["size"]:
            by_group[row["group"]] = row
    for row in by_group.values():
        for rank, seconds in row["per_rank_seconds"].items():
            values[int(rank)] = min(values.get(int(rank), float("inf")), row["size"] / seconds / 1e9)
    return values
