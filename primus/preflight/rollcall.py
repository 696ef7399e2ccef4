"""Before a multi-node preflight starts any worker, every node answers a roll call on node 0.

torchrun's c10d rendezvous starts no worker until every node has arrived, and when one never
does it ends with a bare ``RendezvousTimeoutError``: nothing ran that could name the node or
write a report. So each node's launcher first writes its node rank and host into a TCPStore
that node 0 hosts at ``MASTER_ADDR:MASTER_PORT``; node 0 waits up to the timeout and either
lets every node go on to torchrun (closing the store, so torchrun can bind the port) or names
the nodes that never came in one line. Node ranks come from ``--node-rank``/``NODE_RANK``
(Slurm sets them).
"""
from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta

PREFIX = "primus-preflight-rollcall/"
_CLIENT_GRACE_S = 2.0  # a node waits this long after the go, so node 0 has closed the roll-call store


class RollCallError(RuntimeError):
    """This node could not take part (node 0 unreachable, or it never answered)."""


@dataclass
class RollCall:
    expected: int
    joined: dict[int, str] = field(default_factory=dict)  # node rank -> host
    duplicates: dict[int, int] = field(default_factory=dict)  # node rank -> how many nodes claimed it
    timeout: float = 0.0

    @property
    def missing(self) -> list[int]:
        return [n for n in range(self.expected) if n not in self.joined]

    @property
    def ok(self) -> bool:
        return not self.missing and not self.duplicates

    def line(self) -> str:
        joined = ", ".join(f"node {n} ({h})" for n, h in sorted(self.joined.items())) or "none"
        text = f"expected {self.expected} nodes; joined: {joined}"
        if self.missing:
            text += (f"; never arrived within {self.timeout:.0f} s: "
                     + ", ".join(f"node {n}" for n in self.missing))
        if self.duplicates:
            text += "; node rank claimed by more than one node: " + ", ".join(
                f"node {n} ({c} nodes)" for n, c in sorted(self.duplicates.items()))
        return text

    def to_dict(self) -> dict:
        return {"expected": self.expected, "joined": {str(n): h for n, h in self.joined.items()},
                "missing": self.missing, "duplicates": {str(n): c for n, c in self.duplicates.items()}}


def roll_call(nnodes: int, node_rank: int, master_addr: str, master_port: int, timeout: float,
              host: str | None = None) -> RollCall:
    """Node 0: host the roll call and return who came. Other nodes: answer it and return
    node 0's verdict. Raises ``RollCallError`` when this node cannot reach node 0."""
    import torch.distributed as dist

    host = host or socket.gethostname()
    leader = node_rank == 0
    try:
        store = dist.TCPStore(master_addr, master_port, None, leader, timedelta(seconds=timeout),
                              wait_for_workers=False)
    except (RuntimeError, OSError) as exc:
        what = "host the roll call on" if leader else "reach node 0 at"
        raise RollCallError(f"node {node_rank} could not {what} {master_addr}:{master_port} within {timeout:.0f} s "
                            f"({' '.join(str(exc).split())[:200]})") from None
    store = dist.PrefixStore(PREFIX, store)
    claims = int(store.add(f"claims/{node_rank}", 1))
    store.set(f"node/{node_rank}", host)
    store.add("answered", 1)
    if leader:
        return _lead(store, nnodes, timeout)
    return _follow(store, nnodes, node_rank, timeout, claims)


def _lead(store, nnodes: int, timeout: float) -> RollCall:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and int(store.add("answered", 0)) < nnodes:
        time.sleep(0.05)
    call = RollCall(nnodes, timeout=timeout)
    for n in range(nnodes):
        if store.check([f"node/{n}"]):
            call.joined[n] = store.get(f"node/{n}").decode()
            claims = int(store.add(f"claims/{n}", 0))
            if claims > 1:
                call.duplicates[n] = claims
    store.set("verdict", json.dumps(call.to_dict()))
    present = len(call.joined) - 1
    until = time.monotonic() + 5.0  # let the others read the verdict before the store goes away
    while time.monotonic() < until and int(store.add("acks", 0)) < present:
        time.sleep(0.05)
    return call


def _follow(store, nnodes: int, node_rank: int, timeout: float, claims: int) -> RollCall:
    try:
        store.wait(["verdict"], timedelta(seconds=timeout + 30))
    except (RuntimeError, OSError):
        raise RollCallError(f"node {node_rank}: node 0 gave no verdict within {timeout + 30:.0f} s") from None
    data = json.loads(store.get("verdict"))
    store.add("acks", 1)
    call = RollCall(nnodes, {int(n): h for n, h in data["joined"].items()},
                    {int(n): c for n, c in data["duplicates"].items()}, timeout)
    time.sleep(_CLIENT_GRACE_S)
    return call


def nodes_ready(options: dict, plan) -> int | None:
    """Run the roll call for a multi-node preflight. None: every node is here, go on to torchrun.
    Otherwise the exit status, after one line (and, on node 0, the report with a FAIL finding)."""
    import sys

    timeout = min(float(options["timeout"]), float(plan.rdzv_timeout))
    try:
        call = roll_call(plan.nnodes, plan.node_rank, plan.master_addr, plan.master_port, timeout)
    except RollCallError as exc:
        print(f"preflight: FAIL: {exc}", file=sys.stderr, flush=True)
        return 1
    if call.ok:
        return None
    if plan.node_rank != 0:
        print(f"preflight: node {plan.node_rank} stops: node 0 reports {call.line()}", file=sys.stderr, flush=True)
        return 1
    print(f"preflight: FAIL: {call.line()}", flush=True)
    paths = _write_missing_nodes_report(options, call, plan)
    print(f"preflight: FAIL (nodes missing); report: {paths['json']}, {paths['markdown']}, {paths.get('pdf', 'no PDF')}",
          flush=True)
    return 1


def _write_missing_nodes_report(options: dict, call: RollCall, plan) -> dict[str, str]:
    from primus.preflight.checks import Context
    from primus.preflight.findings import fail
    from primus.preflight.options import PreflightOptions
    from primus.preflight.report import build_report, write_report
    from primus.plan.thresholds import load_thresholds

    opts = PreflightOptions.from_dict({**options, "checks": "connectivity"})  # no rank ran: nothing else to judge
    thresholds = load_thresholds(opts.thresholds)
    per_node = plan.nproc_per_node
    ranks = {n: list(range(n * per_node, (n + 1) * per_node)) for n in range(call.expected)}
    missing_ranks = [r for n in call.missing for r in ranks[n]]
    hosts = {r: h for n, h in call.joined.items() for r in ranks[n]}
    finding = fail("connectivity", f"{call.line()} (roll call on {plan.master_addr}:{plan.master_port})",
                   missing_ranks, nodes=call.to_dict())
    ctx = Context(plan.world_size, thresholds, hosts, opts.to_dict())
    report = build_report(opts, thresholds, ctx, {}, {}, [finding], "not started")
    report["world"]["hosts"] = {str(r): h for r, h in sorted(hosts.items())}
    return write_report(report, opts.report_dir)
