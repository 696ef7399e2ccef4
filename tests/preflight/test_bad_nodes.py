"""Preflight names the bad node: per-node figures against the fleet median, the pairwise bisection of
inter-node links, the evidence table (Markdown and PDF) and the Slurm exclude list.

The bisection is driven here by a model of the fleet (a pair is as fast as its slower node), the
report by synthetic measurements; ``test_bad_node_e2e.py`` runs it on simulated nodes.
"""
from __future__ import annotations

import pytest

from primus.preflight.checks import Context
from primus.preflight.nodes import judge_nodes, node_findings
from primus.preflight.options import PreflightOptions
from primus.preflight.perf.pairwise import bisect_rounds, first_round, run_pairwise
from primus.preflight.report import build_report
from primus.preflight.report.markdown import render_markdown
from primus.plan.thresholds import load_thresholds
from tests.preflight.test_report_scale import _pdf_text


class FleetModel:
    """``PairRunner``'s interface over a model: node -> link GB/s; a pair runs at its slower node."""

    def __init__(self, speeds: dict[str, float]):
        self.nodes = {name: [i] for i, name in enumerate(speeds)}
        self.speeds, self.size, self.local, self.rounds = speeds, 4 * 2**20, 1, []

    def measure(self, pairs):
        self.rounds.append(list(pairs))
        return {pair: min(self.speeds[pair[0]], self.speeds[pair[1]]) for pair in pairs}


def _bad(speeds: dict[str, float]) -> tuple[list[str], FleetModel]:
    fleet = FleetModel(speeds)
    pairwise = run_pairwise(fleet, margin=0.2)
    hosts = {i: name for i, name in enumerate(speeds)}
    return judge_nodes({"gemm": [], "membw": [], "collectives": []}, hosts, pairwise, load_thresholds())["bad"], fleet


def test_pairs_then_each_node_of_a_slow_pair_against_a_healthy_one():
    assert first_round(["a", "b", "c", "d", "e"]) == ([("a", "b"), ("c", "d")], ["e"])
    assert bisect_rounds(["c", "d"], ["a", "b"]) == [[("c", "a"), ("d", "b")]]
    assert bisect_rounds(["c", "d", "e"], ["a"]) == [[("c", "a")], [("d", "a")], [("e", "a")]]
    bad, fleet = _bad({"n1": 10.0, "n2": 10.0, "n3": 10.0, "n4": 1.0})
    assert bad == ["n4"]
    assert fleet.rounds == [[("n1", "n2"), ("n3", "n4")], [("n3", "n1"), ("n4", "n2")]]  # two rounds, not all pairs


@pytest.mark.parametrize("speeds, expected", [
    ({f"n{i}": 10.0 for i in range(1, 9)} | {"n6": 2.0}, ["n6"]),
    ({f"n{i}": 10.0 for i in range(1, 9)} | {"n3": 2.0, "n4": 3.0}, ["n3", "n4"]),  # both nodes of one pair
    ({f"n{i}": 10.0 for i in range(1, 9)} | {"n1": 2.0, "n8": 1.0}, ["n1", "n8"]),
    ({f"n{i}": 10.0 for i in range(1, 6)} | {"n5": 1.0}, ["n5"]),  # the odd node out
    ({f"n{i}": 10.0 + i * 0.1 for i in range(1, 9)}, []),  # within the margin: nobody
])
def test_exactly_the_slow_nodes_are_named(speeds, expected):
    assert _bad(speeds)[0] == expected


class MeasuredFleet(FleetModel):
    """Pair figures as a loaded 4-node run measured them (GB/s): n4 throttled, n3 slowed by the load."""

    FIGURES = {("n1", "n2"): 0.89, ("n3", "n4"): 0.003, ("n3", "n1"): 0.229, ("n4", "n2"): 0.0056}

    def measure(self, pairs):
        self.rounds.append(list(pairs))
        return {pair: self.FIGURES[pair] for pair in pairs}


def test_a_healthy_node_slowed_by_load_beside_the_bad_one_is_cleared():
    fleet = MeasuredFleet({name: 0.0 for name in ("n1", "n2", "n3", "n4")})
    pairwise = run_pairwise(fleet, margin=0.5)
    hosts = {i: name for i, name in enumerate(fleet.speeds)}
    judged = judge_nodes({"gemm": [], "membw": [], "collectives": []}, hosts, pairwise, load_thresholds())
    assert pairwise["bad"] == ["n4"] and judged["bad"] == ["n4"]  # n3 (0.229) moves 40x what n4 does: cleared


def _report(slow_gemm_rank: int | None = None, link: dict[str, float] | None = None):
    """4 single-GPU nodes (one rank each), GEMM and memory bandwidth per rank, optional pairwise figures."""
    hosts = {r: f"node{r + 1}" for r in range(4)}
    facts = {r: {"identity": {"rank": r, "host": hosts[r], "local_rank": 0, "device": "cpu"}} for r in hosts}
    results = {}
    for r in hosts:
        gflops = 20.0 if r == slow_gemm_rank else 100.0 + r
        results[r] = {"rank": r, "errors": [], "collectives": {}, "groups": {},
                      "gemm": {"dtype": "float32", "n": 512, "iters": 10, "seconds": 1.0, "gflops": gflops},
                      "membw": {"bytes": 2**25, "iters": 5, "seconds": 1.0, "gbps": 8.0}}
    if link:
        fleet = FleetModel(link)
        results[0]["pairwise"] = run_pairwise(fleet, margin=0.2)
    thresholds = load_thresholds()
    opts = PreflightOptions.from_dict({"quick": True, "report_dir": "unused", "checks": "host", "timeout": 60})
    ctx = Context(4, thresholds, hosts, opts.to_dict())
    return build_report(opts, thresholds, ctx, facts, results, [], "cpu")


def test_the_report_names_the_node_gives_the_evidence_and_the_exclude_list(tmp_path):
    report = _report(link={"node1": 9.0, "node2": 9.5, "node3": 0.5, "node4": 9.2})
    assert report["status"] == "fail" and report["nodes"]["bad"] == ["node3"]
    assert report["nodes"]["exclude"] == "--exclude=node3"
    bad = [f for f in report["findings"] if f["check"] == "nodes" and f["level"] == "fail"]
    assert len(bad) == 1 and bad[0]["ranks"] == [2]
    assert bad[0]["message"].startswith("bad node node3: inter-node link 0.5 GB/s (paired with node1) is 6% of the "
                                        "fleet median 9 GB/s (margin 20%)")
    markdown = render_markdown(report, {})
    nodes = markdown.split("## Nodes\n", 1)[1].split("\n## ", 1)[0]
    assert "Leave them out: --exclude=node3" in nodes
    assert "| node3 | 2 | 102 | 8 | 0.5 w/ node1 * | BAD |" in nodes
    assert "| node1 | 0 | 100 | 8 | 9 w/ node2 | ok |" in nodes
    pairs = markdown.split("## Inter-node pairs\n", 1)[1].split("\n## ", 1)[0]
    assert "| 1 | node3 - node4 | 0.5 |" in pairs and "| 2 | node3 - node1 | 0.5 |" in pairs
    pytest.importorskip("fpdf")
    from primus.preflight.report.pdf import render_pdf

    render_pdf(report, {}, tmp_path, tmp_path / "report.pdf")
    text = _pdf_text(tmp_path / "report.pdf")
    assert "--exclude=node3" in text and "0.5 w/ node1 *" in text and "BAD" in text and "Inter-node pairs" in text


def test_a_node_with_a_slow_gpu_is_named_by_its_gemm():
    report = _report(slow_gemm_rank=1)
    assert report["nodes"]["bad"] == ["node2"]
    message = next(f["message"] for f in report["findings"] if f["check"] == "nodes" and f["level"] == "fail")
    assert message.startswith("bad node node2: GEMM 20 GFLOP/s is 20% of the fleet median 101 GFLOP/s (margin 20%)")


def test_fewer_than_four_nodes_cannot_pin_a_link_and_a_healthy_fleet_says_so():
    judgment = judge_nodes({"gemm": [], "membw": [], "collectives": []}, {0: "a", 1: "b"},
                           run_pairwise(FleetModel({"a": 1.0, "b": 9.0}), margin=0.2), load_thresholds())
    assert judgment["bad"] == [] and "link" not in judgment["medians"]
    assert any("cannot be pinned on one node" in f.message for f in node_findings(judgment))
    healthy = _report(link={"node1": 9.0, "node2": 9.5, "node3": 9.4, "node4": 9.2})
    assert healthy["nodes"]["bad"] == [] and healthy["status"] == "pass"
    assert any(f["message"].startswith("all 4 nodes within 20% of the fleet median (GEMM, memory bandwidth, "
                                       "inter-node link)") for f in healthy["findings"])
