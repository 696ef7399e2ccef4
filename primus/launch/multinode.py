"""The multi-node parts of a job: waiting for node 0, and naming a lost peer.

Rendezvous is torchrun's ``c10d`` on ``MASTER_ADDR:MASTER_PORT``, its store hosted by node 0
(``LaunchPlan.rendezvous_args``); every node waits at most ``rdzv_timeout`` seconds for the
others, so a node that never arrives, a wrong address or a port in use ends in one line.

Run directory (see README "Multi-node"): only node 0 claims it (``primus.launch.job``). With a
shared filesystem (``shared_fs: true``, the default) a node > 0 waits, at most
``run_dir_timeout`` seconds, until node 0 has written the payload for *this* attempt (same
rendezvous id, manifest ``running``) and then starts its workers, which read node 0's resolved
config. With ``shared_fs: false`` each node > 0 writes its own copy of the resolved config and
payload into its local run directory; the manifest, metrics and plots stay on node 0.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

from primus.launch.plan import LaunchPlan
from primus.runtime.rundir import RunDir


class LeaderMissing(Exception):
    pass


def wait_for_leader(run_dir: RunDir, plan: LaunchPlan, *, poll: float = 0.5) -> dict[str, Any]:
    """Node > 0 on a shared filesystem: wait until node 0 has prepared this attempt."""
    deadline = time.monotonic() + plan.run_dir_timeout
    print(f"[primus] node {plan.node_rank}: waiting up to {plan.run_dir_timeout}s for node 0 to prepare "
          f"{run_dir} (rendezvous id '{plan.rdzv_id}')", flush=True)
    while True:
        payload = run_dir.read_payload()
        if (payload.get("attempt") == plan.rdzv_id and run_dir.read_manifest().get("status") == "running"
                and run_dir.config.is_file()):
            return payload
        if time.monotonic() > deadline:
            raise LeaderMissing(
                f"node {plan.node_rank}: node 0 did not prepare {run_dir} for rendezvous id '{plan.rdzv_id}' within "
                f"{plan.run_dir_timeout}s (is node 0 running with the same rdzv id? without a shared filesystem "
                "set launcher.shared_fs: false)")
        time.sleep(poll)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


class PeerWatch:
    """Name the node that was lost when a multi-node job fails.

    Every node's launcher listens on a small TCP "beacon" port for the life of its workers
    and records ``nodes/node-<rank>.json`` (host, address, port) in the run dir. When the
    workers fail, the launcher probes every other node's beacon: one that cannot be reached
    within a few seconds is named as the lost peer (link cut, host down), which the engine's
    own error (a collective timeout) does not say.
    """

    def __init__(self, run_dir: RunDir, plan: LaunchPlan, probe_timeout: float = 3.0):
        self.run_dir, self.plan, self.probe_timeout = run_dir, plan, probe_timeout
        self.server: socket.socket | None = None

    def __enter__(self) -> "PeerWatch":
        if self.plan.nnodes <= 1:
            return self
        address = self._own_address()
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("0.0.0.0", 0))
        self.server.listen(16)
        threading.Thread(target=self._serve, daemon=True).start()
        folder = self.run_dir.nodes
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
        for path in sorted(self.run_dir.nodes.glob("node-*.json")):
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
