"""Measured GEMM and memory bandwidth against what a healthy device of that model reaches.

Stragglers (``stragglers.py``) compare ranks with each other, which cannot see a whole node
(or a whole job) of devices running slow: a wrong power cap, a throttled clock, a bad
driver. Here each rank's numbers are judged against ``thresholds.expected`` for its device
model (MI300X, MI325X, MI355X, H100, H200); CPUs and unknown models are not judged.
"""
from __future__ import annotations

from typing import Any

from primus.plan.devices import device_key
from primus.preflight.findings import Finding, fail, warn


def device_names(facts: dict[int, Any]) -> dict[int, str]:
    names = {}
    for rank, f in facts.items():
        acc = f.get("accelerators") or {}
        if acc.get("available"):
            names[rank] = acc["devices"][acc["local_device"]]["name"]
    return names


def expected_findings(measurements: dict[str, Any], facts: dict[int, Any], thresholds: dict[str, Any],
                      hosts: dict[int, str]) -> list[Finding]:
    expected = thresholds["expected"]
    warn_at, fail_at = expected["warn_fraction"], expected["fail_fraction"]
    names = device_names(facts)
    found: list[Finding] = []
    for what, rows, key, table, unit, scale in (
            ("GEMM", measurements["gemm"], "gflops", expected["gemm_tflops"], "TFLOP/s", 1e-3),
            ("memory bandwidth", measurements["membw"], "gbps", expected["hbm_gbps"], "GB/s", 1.0)):
        slow: dict[str, list[tuple[int, float, float]]] = {"fail": [], "warn": []}
        for row in rows:
            model = device_key(names.get(row["rank"], ""))
            if model is None or model not in table:
                continue
            value, target = row[key] * scale, float(table[model])
            ratio = value / target
            if ratio < fail_at:
                slow["fail"].append((row["rank"], value, ratio))
            elif ratio < warn_at:
                slow["warn"].append((row["rank"], value, ratio))
        for level, items in slow.items():
            if not items:
                continue
            model = device_key(names[items[0][0]])
            worst = min(items, key=lambda item: item[2])
            shown = ", ".join(f"rank {r} ({hosts.get(r, '?')}) {v:.0f}" for r, v, _ in sorted(items)[:8])
            more = f" and {len(items) - 8} more" if len(items) > 8 else ""
            make = fail if level == "fail" else warn
            found.append(make("performance", f"{what} far below a healthy {model.upper()} "
                              f"({table[model]} {unit} expected, under {warn_at if level == 'warn' else fail_at:.0%} "
                              f"of it) on {len(items)} rank(s): {shown}{more} {unit}; worst {worst[2]:.0%}",
                              [r for r, _, _ in items], metric=what, expected=table[model], unit=unit,
                              values={r: v for r, v, _ in items}))
    return found
