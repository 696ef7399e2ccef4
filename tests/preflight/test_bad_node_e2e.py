"""`primus preflight` over 4 simulated nodes (network namespaces on a bridge, one launcher each), one of
them throttled with a token-bucket filter on its link (50 Mbit/s both ways): the report names exactly
that node, the PDF carries the evidence table, and the exclude list is printed ready to paste."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.conftest import PRIMUS, ROOT
from tests.launch.conftest import netns_hosts
from tests.preflight.test_report_scale import _pdf_text

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
NODES, SLOW = 4, 4


@pytest.fixture(scope="module")
def four_hosts(tmp_path_factory):
    yield from netns_hosts(tmp_path_factory, "ppf", "10.77.0", count=NODES)


def _throttle(hosts, node: int) -> None:
    """Both directions of node's link: the bridge side of its veth (into it) and its eth0 (out of it)."""
    tbf = ["root", "tbf", "rate", "50mbit", "burst", "32kbit", "latency", "400ms"]
    subprocess.run(["tc", "qdisc", "add", "dev", f"{hosts.prefix}_v{node}", *tbf], check=True, timeout=10)
    subprocess.run(["ip", "netns", "exec", f"{hosts.prefix}_n{node}", "tc", "qdisc", "add", "dev", "eth0", *tbf],
                   check=True, timeout=10)


def test_the_throttled_node_is_named_and_excluded(four_hosts, tmp_path):
    _throttle(four_hosts, SLOW)
    report_dir = tmp_path / "report"
    thresholds = tmp_path / "thresholds.yaml"  # the stated margin: a node under half the fleet median is named
    thresholds.write_text("nodes:\n  margin: 0.5\n")
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "PRIMUS_USER_CONFIG": "/nonexistent", "PYTHONUNBUFFERED": "1",
           **four_hosts.env}
    env = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT", "NNODES", "NODE_RANK")}
    procs = []
    for i in range(1, NODES + 1):
        argv = [*PRIMUS, "preflight", "--quick", "--tests", "pairwise", "-N", str(NODES), "--node-rank", str(i - 1),
                "--master-addr", four_hosts.addr(1), "--master-port", "29531", "--rdzv-id", "badnode",
                "--rdzv-timeout", "120", "--timeout", "120", "--report-dir", str(report_dir),
                "--thresholds", str(thresholds)]
        log = open(tmp_path / f"n{i}.log", "w")
        procs.append(subprocess.Popen(["timeout", "-k", "10", "400", *four_hosts.on(i, argv)], cwd=ROOT, env=env,
                                      stdout=log, stderr=subprocess.STDOUT))
    codes = [p.wait(timeout=450) for p in procs]
    out = (tmp_path / "n1.log").read_text()
    assert codes[0] == 1 and codes[1:] == [0] * (NODES - 1), out[-3000:]
    assert "preflight: leave out the bad node(s): --exclude=n4" in out
    report = json.loads((report_dir / "report.json").read_text())
    assert report["nodes"]["bad"] == ["n4"] and report["nodes"]["exclude"] == "--exclude=n4"
    fails = [f for f in report["findings"] if f["level"] == "fail"]
    assert [f["details"].get("node") for f in fails] == ["n4"], fails
    assert fails[0]["message"].startswith("bad node n4: inter-node link ") and "(margin 50%)" in fails[0]["message"]
    pairwise = report["nodes"]["pairwise"]
    assert [len(r["pairs"]) for r in pairwise["rounds"]] == [2, 2]  # pairs, then the slow pair bisected
    figures = {node: f["gbps"] for node, f in pairwise["figures"].items()}
    assert figures["n4"] < 0.2 * min(v for node, v in figures.items() if node != "n4")
    print(f"link GB/s per node: {figures}")
    markdown = (report_dir / "report.md").read_text()
    assert "Leave them out: --exclude=n4" in markdown and "| n4 | 3 |" in markdown
    text = _pdf_text(report_dir / "report.pdf")
    assert "Nodes" in text and "BAD" in text and "--exclude=n4" in text and "Inter-node pairs" in text
