"""What this node launches: ``LaunchPlan`` (processes, nodes, rendezvous) from the launcher config.

Environment names kept from Primus: ``NNODES``, ``NODE_RANK``, ``GPUS_PER_NODE``,
``MASTER_ADDR``, ``MASTER_PORT`` (flags win over them). Every executor builds the same plan.
"""
from __future__ import annotations

import os
import shlex
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from primus.config.errors import ConfigError
from primus.config.values import env_count
from primus.launch.config import LauncherConfig

WORKER_MODULE = "primus.runtime.worker"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LaunchPlan:
    nproc_per_node: int = 1
    nnodes: int = 1
    min_nodes: int | None = None  # elastic: torchrun --nnodes MIN:MAX, a restart goes on with the survivors
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    max_restarts: int = 0
    # multi-node (nnodes > 1): c10d rendezvous on master_addr:master_port, hosted by node 0
    rdzv_id: str = "primus"
    rdzv_timeout: int = 300
    rdzv_last_call: int = 30  # elastic: how long a rendezvous waits for more than the minimum of nodes
    local_addr: str | None = None
    shared_fs: bool = True
    run_dir_timeout: int = 300

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def in_process(self) -> bool:
        return self.world_size == 1

    @property
    def is_node_zero(self) -> bool:
        """Node 0 owns the run directory (lock, resume decision, resolved config, manifest)."""
        return self.node_rank == 0

    @classmethod
    def from_env(cls, nproc_per_node: int | None = None, nnodes: int | None = None, node_rank: int | None = None,
                 master_addr: str | None = None, master_port: int | None = None, max_restarts: int = 0) -> "LaunchPlan":
        env = os.environ
        return cls(
            nproc_per_node=nproc_per_node or env_count("GPUS_PER_NODE") or 1,
            nnodes=nnodes or env_count("NNODES") or 1,
            node_rank=node_rank if node_rank is not None else env_count("NODE_RANK", minimum=0) or 0,
            master_addr=master_addr or env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=master_port or env_count("MASTER_PORT"),
            max_restarts=max_restarts,
        )

    def with_port(self) -> "LaunchPlan":
        if self.master_port is None:
            self.master_port = free_port() if self.nnodes == 1 else 29500
        return self

    def rendezvous_args(self) -> list[str]:
        """torchrun's c10d rendezvous; ``is_host`` from the node rank, never guessed from hostnames,
        so two "nodes" on one address cannot both try to host the store."""
        conf = (f"join_timeout={self.rdzv_timeout},read_timeout={self.rdzv_timeout},"
                f"is_host={'true' if self.node_rank == 0 else 'false'}")
        if self.elastic:
            conf += f",last_call_timeout={self.rdzv_last_call}"
        args = ["--rdzv-backend=c10d", f"--rdzv-endpoint={self.master_addr}:{self.master_port}",
                f"--rdzv-id={self.rdzv_id}", f"--rdzv-conf={conf}"]
        if self.local_addr:
            args.append(f"--local-addr={self.local_addr}")
        return args

    @property
    def elastic(self) -> bool:
        return self.min_nodes is not None and self.min_nodes < self.nnodes

    def torchrun_args(self, target: str, payload_path: Path) -> list[str]:
        nodes = f"{self.min_nodes}:{self.nnodes}" if self.elastic else str(self.nnodes)
        args = [f"--nnodes={nodes}", f"--nproc-per-node={self.nproc_per_node}"]
        if self.nnodes > 1:  # c10d assigns node ranks; node 0 hosts the store
            args += self.rendezvous_args()
        else:
            args += [f"--node-rank={self.node_rank}", f"--master-addr={self.master_addr}",
                     f"--master-port={self.master_port}"]
        args.append(f"--max-restarts={self.max_restarts}")
        return [*args, "-m", WORKER_MODULE, target, str(payload_path)]

    def command(self, target: str, payload_path: Path) -> list[str]:
        """The exact process command (what --dry-run prints)."""
        if self.in_process:
            return [sys.executable, "-m", WORKER_MODULE, target, str(payload_path)]
        return [sys.executable, "-m", "torch.distributed.run", *self.torchrun_args(target, payload_path)]

    def describe(self, target: str, payload_path: Path) -> str:
        prefix = "(in-process) " if self.in_process else ""
        return prefix + shlex.join(self.command(target, payload_path))


def plan_from_config(config: LauncherConfig) -> LaunchPlan:
    plan = LaunchPlan(nproc_per_node=config.nproc_per_node or config.slurm.gpus_per_node or 1,
                      nnodes=config.nnodes or 1, node_rank=config.node_rank or 0,
                      master_addr=config.master_addr or "127.0.0.1", master_port=config.master_port,
                      max_restarts=config.max_restarts, rdzv_timeout=config.rdzv_timeout,
                      rdzv_last_call=config.rdzv_last_call,
                      local_addr=config.local_addr, shared_fs=config.shared_fs,
                      run_dir_timeout=config.run_dir_timeout)
    if config.rdzv_id:
        plan.rdzv_id = config.rdzv_id
    if config.min_nodes is not None:
        plan.min_nodes = config.min_nodes
        if plan.min_nodes > plan.nnodes:
            raise ConfigError(f"-N {plan.min_nodes}:{plan.nnodes}: the minimum is above the number of nodes")
        if plan.elastic and plan.max_restarts < 1:
            raise ConfigError(f"-N {plan.min_nodes}:{plan.nnodes} continues on fewer nodes through a restart: give "
                              "--max-restarts K (K >= 1)")
    if plan.node_rank >= plan.nnodes:
        raise ConfigError(f"node rank {plan.node_rank} is outside a {plan.nnodes}-node job (ranks 0..{plan.nnodes - 1})")
    if plan.nnodes > 1 and not config.master_addr:
        raise ConfigError(f"a {plan.nnodes}-node job needs the rendezvous host: set MASTER_ADDR or --master-addr "
                          "(the address of node 0, reachable from every node)")
    return plan


def world_size_of(nproc_per_node: int | None, nnodes: int | None, env=os.environ) -> tuple[int | None, str]:
    """(world size, where it came from): flags, then GPUS_PER_NODE/NNODES; None when neither says.
    A count below 1 or not a number, from a flag or a variable, is a user error naming it."""
    parts, sources = [], []
    for flag, value, var in (("--nproc-per-node", nproc_per_node, "GPUS_PER_NODE"), ("-N", nnodes, "NNODES")):
        from_env = env_count(var, env) if value is None else None
        if value is not None:
            parts.append(value)
            sources.append(f"{flag} {value}")
        elif from_env is not None:
            parts.append(from_env)
            sources.append(f"${var}={from_env}")
        else:
            parts.append(1)
    from primus.plan.search import MAX_NODES

    if parts[1] > MAX_NODES:
        raise ConfigError(f"{sources[-1]}: more than {MAX_NODES:,} nodes is not a cluster to plan for")
    if not sources:
        world = env_count("WORLD_SIZE", env)
        if world is not None:
            return world, f"$WORLD_SIZE={world}"
        return None, "not given (--nproc-per-node, -N): the smallest world the experiment's layout runs on"
    return parts[0] * parts[1], f"{parts[0]} per node x {parts[1]} node(s) from {', '.join(sources)}"
