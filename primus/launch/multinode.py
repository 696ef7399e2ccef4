"""This node's part of an N-node job: c10d rendezvous, and who owns the run directory.

Rendezvous: torchrun's ``c10d`` backend on ``MASTER_ADDR:MASTER_PORT``, its store hosted by
node 0 (``is_host`` is set from the node rank, never guessed from hostnames, so two "nodes"
on one address cannot both try to host it). Every node waits at most ``rdzv_timeout``
seconds for the others; a node that never arrives, a wrong address or a port in use ends
in one line naming the endpoint instead of a hang.

Run directory (see README "Multi-node"): only node 0 claims it (lock, resume decision,
``config.resolved.yaml``, ``launch.json``, manifest). With a shared filesystem
(``shared_fs: true``, the default) a node > 0 waits, at most ``run_dir_timeout`` seconds,
until node 0 has written ``launch.json`` for *this* attempt (same rendezvous id, manifest
``running``) and then starts its workers, which read node 0's resolved config. With
``shared_fs: false`` each node > 0 writes its own copy of the resolved config and payload
into its local run directory; the manifest, metrics and plots stay on node 0.
"""
from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

from primus.config.errors import ConfigError
from primus.launch.config import LauncherConfig
from primus.launch.local import LaunchPlan
from primus.runtime.preemption import PREEMPTED_EXIT, PREEMPTED_MARKER

PAYLOAD = "launch.json"


def plan_from_config(config: LauncherConfig) -> LaunchPlan:
    plan = LaunchPlan(nproc_per_node=config.nproc_per_node or config.slurm.gpus_per_node or 1,
                      nnodes=config.nnodes or 1, node_rank=config.node_rank or 0,
                      master_addr=config.master_addr or "127.0.0.1", master_port=config.master_port,
                      max_restarts=config.max_restarts, rdzv_timeout=config.rdzv_timeout,
                      local_addr=config.local_addr, shared_fs=config.shared_fs,
                      run_dir_timeout=config.run_dir_timeout)
    if config.rdzv_id:
        plan.rdzv_id = config.rdzv_id
    if plan.node_rank >= plan.nnodes:
        raise ConfigError(f"node rank {plan.node_rank} is outside a {plan.nnodes}-node job (ranks 0..{plan.nnodes - 1})")
    if plan.nnodes > 1 and not config.master_addr:
        raise ConfigError(f"a {plan.nnodes}-node job needs the rendezvous host: set MASTER_ADDR or --master-addr "
                          "(the address of node 0, reachable from every node)")
    return plan


def rendezvous_args(plan: LaunchPlan) -> list[str]:
    conf = (f"join_timeout={plan.rdzv_timeout},read_timeout={plan.rdzv_timeout},"
            f"is_host={'true' if plan.node_rank == 0 else 'false'}")
    args = ["--rdzv-backend=c10d", f"--rdzv-endpoint={plan.master_addr}:{plan.master_port}",
            f"--rdzv-id={plan.rdzv_id}", f"--rdzv-conf={conf}"]
    if plan.local_addr:
        args.append(f"--local-addr={plan.local_addr}")
    return args


def describe_rendezvous_error(err: BaseException, plan: LaunchPlan) -> str:
    """One line for a failed rendezvous, naming the endpoint, the node and the likely cause."""
    endpoint = f"{plan.master_addr}:{plan.master_port}"
    where = f"node {plan.node_rank} of {plan.nnodes} ({socket.gethostname()})"
    text = " ".join(f"{err} {err.__cause__ or ''}".split())
    name = type(err).__name__
    if "address already in use" in text.lower() or "EADDRINUSE" in text:
        cause = f"port {plan.master_port} is already in use on {plan.master_addr}: choose another MASTER_PORT"
    elif name == "RendezvousTimeoutError":
        cause = (f"not all {plan.nnodes} nodes joined within {plan.rdzv_timeout}s: a node never arrived "
                 f"(is every node started with MASTER_ADDR={plan.master_addr}, MASTER_PORT={plan.master_port}, "
                 f"rdzv id '{plan.rdzv_id}'?)")
    elif name in ("RendezvousConnectionError", "RendezvousStateError"):
        cause = (f"cannot reach the rendezvous store at {endpoint} within {plan.rdzv_timeout}s: wrong MASTER_ADDR, "
                 "node 0 not running, or a firewall")
    elif name == "RendezvousClosedError":
        cause = "the rendezvous was closed by another node (it failed or was stopped)"
    else:
        cause = name
    return f"rendezvous at {endpoint} failed on {where}: {cause} [{name}: {text[:300]}]"


def is_follower(plan: LaunchPlan) -> bool:
    return plan.nnodes > 1 and plan.node_rank > 0


def wait_for_leader(run_dir: Path, plan: LaunchPlan, *, poll: float = 0.5) -> dict[str, Any]:
    """Node > 0 on a shared filesystem: wait until node 0 has prepared this attempt."""
    deadline = time.monotonic() + plan.run_dir_timeout
    print(f"[primus] node {plan.node_rank}: waiting up to {plan.run_dir_timeout}s for node 0 to prepare "
          f"{run_dir} (rendezvous id '{plan.rdzv_id}')", flush=True)
    while True:
        payload = _read_json(run_dir / PAYLOAD)
        manifest = _read_json(run_dir / "manifest.json")
        if (payload.get("attempt") == plan.rdzv_id and manifest.get("status") == "running"
                and (run_dir / "config.resolved.yaml").is_file()):
            return payload
        if time.monotonic() > deadline:
            raise LeaderMissing(
                f"node {plan.node_rank}: node 0 did not prepare {run_dir} for rendezvous id '{plan.rdzv_id}' within "
                f"{plan.run_dir_timeout}s (is node 0 running with the same rdzv id? without a shared filesystem "
                "set launcher.shared_fs: false)")
        time.sleep(poll)


class LeaderMissing(Exception):
    pass


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def run_follower_node(resolved, module, adapter, engine_plan, plan: LaunchPlan, run_dir: Path, resume: str) -> int:
    """Start this node's workers without claiming the run dir (node 0 owns it)."""
    from primus.launch.local import launch_workers
    from primus.runtime.rundir import make_run_dir, write_resolved_config

    payload_path = run_dir / PAYLOAD
    if plan.shared_fs:
        try:
            wait_for_leader(run_dir, plan)
        except LeaderMissing as missing:
            print(f"[primus] FAILED {missing}", file=sys.stderr, flush=True)
            return 1
    else:
        make_run_dir(run_dir)
        resuming = resume != "never" and (run_dir / "checkpoints").is_dir()  # node-local checkpoint shards
        adapter.prepare(engine_plan, lambda message: print(f"[primus] {message}", flush=True))
        write_resolved_config(run_dir, resolved.redacted_tree())
        payload_path.write_text(json.dumps({"run_dir": str(run_dir), "module": module.name, "resume": resuming,
                                            "attempt": plan.rdzv_id}))
    print(f"[primus] node {plan.node_rank}/{plan.nnodes} of {resolved.spec.exp_name}: starting "
          f"{plan.nproc_per_node} worker(s) -> {run_dir}", flush=True)
    with PeerWatch(run_dir, plan) as peers:
        result = launch_workers("primus.runtime.train:train_worker", payload_path, plan)
        lost = peers.lost_peers() if result.exit_code != 0 else []
    if result.exit_code != 0 and (run_dir / PREEMPTED_MARKER).exists():  # written by global rank 0
        print(f"[primus] node {plan.node_rank} preempted: checkpoint saved", flush=True)
        return PREEMPTED_EXIT
    for line in lost + result.failures:
        print(f"[primus] FAILED {line} (see {run_dir / 'logs' / module.name}/rank-*/error.log)", file=sys.stderr)
    print(f"[primus] node {plan.node_rank} {'done' if result.exit_code == 0 else 'failed'} "
          f"(exit {result.exit_code})", flush=True)
    return result.exit_code


class PeerWatch:
    """Name the node that was lost when a multi-node job fails.

    Every node's launcher listens on a small TCP "beacon" port for the life of its workers
    and records ``nodes/node-<rank>.json`` (host, address, port) in the run dir. When the
    workers fail, the launcher probes every other node's beacon: one that cannot be reached
    within a few seconds is named as the lost peer (link cut, host down), which the engine's
    own error (a collective timeout) does not say.
    """

    def __init__(self, run_dir: Path, plan: LaunchPlan, probe_timeout: float = 3.0):
        self.run_dir, self.plan, self.probe_timeout = run_dir, plan, probe_timeout
        self.server: socket.socket | None = None

    def __enter__(self) -> "PeerWatch":
        if self.plan.nnodes <= 1:
            return self
        import threading

        address = self._own_address()
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("0.0.0.0", 0))
        self.server.listen(16)
        threading.Thread(target=self._serve, daemon=True).start()
        folder = self.run_dir / "nodes"
        folder.mkdir(parents=True, exist_ok=True)
        record = {"node_rank": self.plan.node_rank, "host": socket.gethostname(), "address": address,
                  "port": self.server.getsockname()[1], "attempt": self.plan.rdzv_id}
        (folder / f"node-{self.plan.node_rank}.json").write_text(json.dumps(record))
        return self

    def _own_address(self) -> str:
        """The local address that routes to node 0 (what peers would use to reach us)."""
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((self.plan.master_addr, self.plan.master_port or 29500))
                return probe.getsockname()[0]
        except OSError:
            return socket.gethostname()

    def _serve(self) -> None:
        while self.server is not None:
            try:
                conn, _ = self.server.accept()
                conn.close()
            except OSError:
                return

    def __exit__(self, *exc_info) -> None:
        if self.server is not None:
            server, self.server = self.server, None
            server.close()

    def lost_peers(self) -> list[str]:
        """Lines naming peers whose beacon cannot be reached (call while still inside ``with``)."""
        lines = []
        for path in sorted((self.run_dir / "nodes").glob("node-*.json")):
            peer = _read_json(path)
            if not peer or peer.get("node_rank") == self.plan.node_rank or peer.get("attempt") != self.plan.rdzv_id:
                continue
            try:
                with socket.create_connection((peer["address"], peer["port"]), timeout=self.probe_timeout):
                    pass
            except ConnectionRefusedError:
                continue  # the host answered: that node's launcher already exited, it was not lost
            except OSError as exc:
                lines.append(f"lost peer: node {peer['node_rank']} ({peer['host']}, {peer['address']}) is unreachable "
                             f"from node {self.plan.node_rank} ({type(exc).__name__}: {exc.strerror or exc}); "
                             "its link or host went down")
        return lines
