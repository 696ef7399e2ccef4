"""Start the worker processes of this node: in-process for one, ``torch.distributed.run`` for N.

Environment names kept from Primus: ``NNODES``, ``NODE_RANK``, ``GPUS_PER_NODE``,
``MASTER_ADDR``, ``MASTER_PORT`` (flags win over them). Multi-node and Slurm executors
build the same ``LaunchPlan`` and call the same ``launch_workers``.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WORKER_MODULE = "primus.runtime.worker"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LaunchPlan:
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    max_restarts: int = 0
    # multi-node (nnodes > 1): c10d rendezvous on master_addr:master_port, hosted by node 0
    rdzv_id: str = "primus"
    rdzv_timeout: int = 300
    local_addr: str | None = None
    shared_fs: bool = True
    run_dir_timeout: int = 300

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def in_process(self) -> bool:
        return self.world_size == 1

    @classmethod
    def from_env(cls, nproc_per_node: int | None = None, nnodes: int | None = None, node_rank: int | None = None,
                 master_addr: str | None = None, master_port: int | None = None, max_restarts: int = 0) -> "LaunchPlan":
        env = os.environ
        return cls(
            nproc_per_node=nproc_per_node or int(env.get("GPUS_PER_NODE", "1")),
            nnodes=nnodes or int(env.get("NNODES", "1")),
            node_rank=node_rank if node_rank is not None else int(env.get("NODE_RANK", "0")),
            master_addr=master_addr or env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=master_port or (int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else None),
            max_restarts=max_restarts,
        )

    def with_port(self) -> "LaunchPlan":
        if self.master_port is None:
            self.master_port = free_port() if self.nnodes == 1 else 29500
        return self

    def torchrun_args(self, target: str, payload_path: Path) -> list[str]:
        args = [f"--nnodes={self.nnodes}", f"--nproc-per-node={self.nproc_per_node}"]
        if self.nnodes > 1:  # c10d assigns node ranks; node 0 hosts the store (multinode.py)
            from primus.launch.multinode import rendezvous_args

            args += rendezvous_args(self)
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


@dataclass
class LaunchResult:
    exit_code: int
    failures: list[str]


def _single_process_env(plan: LaunchPlan) -> None:
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "GROUP_RANK": "0", "MASTER_ADDR": plan.master_addr, "MASTER_PORT": str(plan.master_port)})


def launch_workers(target: str, payload: dict[str, Any] | Path, plan: LaunchPlan | None = None, *,
                   nproc_per_node: int | None = None) -> LaunchResult:
    """Run ``target`` on every local rank; returns the job's exit status and failure lines."""
    plan = (plan or LaunchPlan.from_env(nproc_per_node=nproc_per_node)).with_port()
    if isinstance(payload, dict):
        handle = tempfile.NamedTemporaryFile("w", suffix=".json", prefix="primus-launch-", delete=False)
        json.dump(payload, handle)
        handle.close()
        payload_path = Path(handle.name)
    else:
        payload_path = Path(payload)
    if plan.in_process:
        from primus.runtime.worker import run_target

        _single_process_env(plan)
        try:
            return LaunchResult(run_target(target, json.loads(payload_path.read_text())), [])
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # (DCP's CheckpointException is a BaseException) logged in error.log
            text = "".join(traceback.format_exception(exc))
            return LaunchResult(1, [f"first failure: rank 0 (in-process) on {socket.gethostname()}: "
                                    f"{summarize_error(text)}"])
    return _torchrun(plan, target, payload_path)


_OS_ERROR = re.compile(r"(?:\w*Error): \[Errno \d+\] [^\n]*")


def summarize_error(text: str) -> str:
    """One line for a failure: an OS error anywhere in the chain (disk full, permission) is
    the clearest cause; otherwise the last line of the traceback."""
    found = _OS_ERROR.findall(text)
    if found:
        return found[-1].strip()
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _consequence_rank(failure) -> tuple:
    """Sort key putting the root cause first: ranks the agent SIGTERMed, or that only lost a
    peer's connection, failed because of another rank; otherwise earliest first."""
    message = failure.message if isinstance(failure.message, str) else str(failure.message or "")
    stopped_by_agent = failure.exitcode == -signal.SIGTERM
    lost_peer = "by peer" in message or "Connection closed" in message
    return (stopped_by_agent or lost_peer, failure.timestamp)


def _torchrun(plan: LaunchPlan, target: str, payload_path: Path) -> LaunchResult:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(plan.torchrun_args(target, payload_path))
    if plan.nnodes == 1 and plan.max_restarts > 0:
        os.environ["PRIMUS_STATIC_RDZV"] = "1"  # see primus.runtime.worker.fresh_store_after_restart
    try:
        run(args)
    except RendezvousError as err:  # a node that never arrived, a wrong address, a port in use
        from primus.launch.multinode import describe_rendezvous_error

        return LaunchResult(1, [describe_rendezvous_error(err, plan)])
    except SignalException as stop:
        # torchelastic forwarded the signal to the workers and waited for them to exit
        name = signal.Signals(stop.sigval).name
        return LaunchResult(128 + int(stop.sigval), [f"launcher got {name}; workers on {socket.gethostname()} were stopped"])
    except ChildFailedError as err:
        host = socket.gethostname()
        lines = []
        ordered = sorted(err.failures.items(), key=lambda item: _consequence_rank(item[1]) + (item[0],))
        for position, (global_rank, failure) in enumerate(ordered):
            cause = f"signal {failure.signal_name()}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
            message = failure.message if isinstance(failure.message, str) else (failure.message or {}).get("message", "")
            summary = summarize_error(message or "")
            role = "first failure" if position == 0 else "then"
            lines.append(f"{role}: rank {global_rank} (local {failure.local_rank}) on {host}: {cause}"
                         + (f": {summary}" if summary else ""))
        return LaunchResult(1, lines)
    return LaunchResult(0, [])
