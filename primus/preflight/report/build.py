"""Judge every rank's facts and measurements on rank 0 and assemble the report dict (the JSON)."""
from __future__ import annotations

import datetime as _dt
import statistics
from typing import Any

from primus.preflight.checks import COLLECTED, Context, module
from primus.preflight.findings import LEVELS, Finding, fail, info
from primus.preflight.nodes import judge_nodes, node_findings
from primus.preflight.options import PreflightOptions
from primus.preflight.perf.collectives import BUS_FACTOR_DOC, combine
from primus.preflight.perf.expected import expected_findings
from primus.preflight.perf.stragglers import find_stragglers, link_values

SCHEMA = "primus.preflight.report/1"


def _evaluate_checks(opts: PreflightOptions, ctx: Context, facts: dict[int, Any]) -> list[Finding]:
    found: list[Finding] = []
    for name in (*COLLECTED, "experiment"):
        if name not in opts.enabled_checks:
            continue
        broken = sorted(r for r, f in facts.items() if "error" in f.get(name, {}))
        if broken:
            found.append(fail(name, f"collecting {name} facts failed on ranks {broken}: "
                              f"{facts[broken[0]][name]['error']}", broken))
        usable = {r: f for r, f in facts.items() if "error" not in f.get(name, {})}
        try:
            found += module(name).evaluate(usable, ctx)
        except Exception as exc:  # noqa: BLE001 - a bug in one check must not lose the report
            found.append(fail(name, f"check {name} crashed: {type(exc).__name__}: {exc}"))
    return found


def _measurements(results: dict[int, Any], hosts: dict[int, str]) -> dict[str, Any]:
    gemm = [{"rank": r, "host": hosts.get(r), **res["gemm"]} for r, res in sorted(results.items()) if "gemm" in res]
    membw = [{"rank": r, "host": hosts.get(r), **res["membw"]} for r, res in sorted(results.items()) if "membw" in res]
    per_key: dict[str, dict[int, Any]] = {}
    groups: dict[str, list[int]] = {}
    for r, res in results.items():
        groups.update(res.get("groups", {}))
        for key, rows in res.get("collectives", {}).items():
            per_key.setdefault(key, {})[r] = rows
    collectives = []
    for key in sorted(per_key):
        op, group = key.split("|", 1)
        collectives += combine(op, group, groups.get(group, sorted(per_key[key])), per_key[key])
    return {"gemm": gemm, "membw": membw, "collectives": collectives, "groups": groups}


def _performance_findings(m: dict[str, Any], hosts: dict[int, str], thresholds: dict[str, Any],
                          results: dict[int, Any], world: int) -> list[Finding]:
    found: list[Finding] = []
    for r, res in sorted(results.items()):
        for error in res.get("errors", []):
            found.append(fail("performance", f"rank {r} ({hosts.get(r, '?')}): {error}", [r]))
    if m["gemm"]:
        values = {row["rank"]: row["gflops"] for row in m["gemm"]}
        row = m["gemm"][0]
        found.append(info("performance", f"GEMM {row['dtype']} n={row['n']}: median {statistics.median(values.values()):.1f} "
                          f"GFLOP/s over {len(values)} rank(s) (min {min(values.values()):.1f})"))
        found += find_stragglers("GEMM", values, hosts, thresholds, "GFLOP/s")
    if m["membw"]:
        values = {row["rank"]: row["gbps"] for row in m["membw"]}
        found.append(info("performance", f"memory bandwidth (copy): median {statistics.median(values.values()):.1f} GB/s"))
        found += find_stragglers("memory bandwidth", values, hosts, thresholds, "GB/s")
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for row in m["collectives"]:
        key = (row["op"], row["group"].split(":")[0])
        if key not in best or row["busbw_gbps"] > best[key]["busbw_gbps"]:
            best[key] = row
    for (op, kind), row in sorted(best.items()):
        found.append(info("performance", f"{op} {kind}-node (n={row['n']}): peak busbw {row['busbw_gbps']:.2f} GB/s "
                          f"at {row['size']:,} bytes"))
    if m["collectives"]:
        found += find_stragglers("link (sendrecv)", link_values(m["collectives"]), hosts, thresholds, "GB/s")
    if world > 1 and m["groups"] and all(g.startswith("intra:") for g in m["groups"]):
        found.append(info("performance", "one node: intra-node collectives only, inter-node not measured"))
    if world == 1:
        found.append(info("performance", "one rank: no collectives to measure"))
    return found


def build_report(opts: PreflightOptions, thresholds: dict[str, Any], ctx: Context, facts: dict[int, Any],
                 results: dict[int, Any], findings: list[Finding], device: str) -> dict[str, Any]:
    """The whole report as one JSON-able dict; ``exit_code`` is 1 on any ``fail`` finding."""
    all_findings = list(findings) + _evaluate_checks(opts, ctx, facts)
    measurements = _measurements(results, ctx.hosts)
    all_findings += _performance_findings(measurements, ctx.hosts, thresholds, results, ctx.world_size)
    all_findings += expected_findings(measurements, facts, thresholds, ctx.hosts)
    pairwise = next((res["pairwise"] for _, res in sorted(results.items()) if res.get("pairwise")), None)
    nodes = judge_nodes(measurements, ctx.hosts, pairwise, thresholds)
    all_findings += node_findings(nodes, fail_on_bad=thresholds["nodes"]["fail_on_bad"])
    all_findings.sort(key=lambda f: -LEVELS.index(f.level))
    counts = {level: sum(f.level == level for f in all_findings) for level in LEVELS}
    return {
        "schema": SCHEMA,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "status": "fail" if counts["fail"] else "pass",
        "exit_code": 1 if counts["fail"] else 0,
        "counts": counts,
        "world": {"world_size": ctx.world_size, "joined": sorted(facts), "hosts": {str(r): h for r, h in sorted(ctx.hosts.items())},
                  "device": device},
        "options": opts.to_dict(),
        "thresholds": thresholds,
        "formulas": {"busbw": {op: f"algbw * {doc}" for op, doc in BUS_FACTOR_DOC.items()},
                     "algbw": "size / seconds / 1e9 (GB/s); seconds = slowest rank's mean per operation",
                     "gemm": "2 * n^3 / seconds / 1e9 (GFLOP/s)", "membw": "2 * bytes / seconds / 1e9 (GB/s, copy)"},
        "findings": [f.to_dict() for f in all_findings],
        "measurements": measurements,
        "nodes": nodes,
        "ranks": {str(r): facts[r] for r in sorted(facts)},
    }
