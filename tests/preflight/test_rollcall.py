"""`primus preflight -N 2` on one host, as two nodes: the roll call names a node that never
arrives (one line, within the timeout, report with a FAIL), and lets torchrun through when both come."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from primus.preflight.rollcall import RollCall

pytestmark = [pytest.mark.timeout(240)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _node(node_rank: int, port: int, report, timeout: int = 10) -> subprocess.Popen:
    thresholds = report.parent / "thresholds.yaml"  # shared CI CPUs are noisy: no straggler fails
    thresholds.write_text("performance:\n  straggler_fail_fraction: 0\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT", "NNODES", "NODE_RANK")}
    return subprocess.Popen([sys.executable, "-m", "primus.cli.main", "preflight", "--quick", "--tests", "gemm",
                             "-N", "2", "--node-rank", str(node_rank), "--master-addr", "127.0.0.1",
                             "--master-port", str(port), "--rdzv-id", f"t{port}", "--rdzv-timeout", "60",
                             "--timeout", str(timeout), "--report-dir", str(report), "--thresholds", str(thresholds)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)


def test_the_roll_call_line_names_who_came_and_who_did_not():
    call = RollCall(3, {0: "a", 2: "c"}, timeout=10)
    assert call.line() == "expected 3 nodes; joined: node 0 (a), node 2 (c); never arrived within 10 s: node 1"
    assert RollCall(2, {0: "a", 1: "b"}, {1: 2}).line().endswith("claimed by more than one node: node 1 (2 nodes)")


@pytest.mark.e2e
def test_a_node_that_never_arrives_is_named_and_the_report_is_written(tmp_path):
    started = time.monotonic()
    proc = _node(0, _free_port(), tmp_path / "r", timeout=5)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    assert time.monotonic() - started < 110  # a hang guard: the 5 s roll-call timeout ends it
    lines = [line for line in out.splitlines() if "never arrived" in line]
    assert lines == [f"preflight: FAIL: expected 2 nodes; joined: node 0 ({socket.gethostname()}); "
                     "never arrived within 5 s: node 1"], out + err
    assert "Traceback" not in out + err
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["status"] == "fail" and report["world"]["world_size"] == 2
    failed = [f for f in report["findings"] if f["level"] == "fail"]
    assert failed[0]["check"] == "connectivity" and failed[0]["ranks"] == [1]
    assert failed[0]["details"]["nodes"]["missing"] == [1]
    assert "never arrived" in (tmp_path / "r" / "report.md").read_text()
    assert (tmp_path / "r" / "report.pdf").stat().st_size > 1000


@pytest.mark.e2e
def test_both_nodes_present_go_on_to_torchrun_on_the_same_port(tmp_path):
    port = _free_port()
    nodes = [_node(rank, port, tmp_path / "r", timeout=60) for rank in (0, 1)]
    results = [node.communicate(timeout=200) for node in nodes]
    for node, (out, err) in zip(nodes, results):
        assert node.returncode == 0, out[-2000:] + err[-2000:]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["world"]["world_size"] == 2 and report["world"]["joined"] == [0, 1]
    assert [g["rank"] for g in report["measurements"]["gemm"]] == [0, 1]
