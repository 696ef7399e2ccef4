"""Start this node's worker processes: in-process for one, ``torch.distributed.run`` for N.

Every executor ends here (``launch_workers``) with a ``LaunchPlan``; whatever goes wrong in
the launcher itself (a rendezvous that cannot start, a port in use, a signal) comes back as a
``LaunchResult`` with one line per failure, never as a traceback.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from primus.config.errors import USER_ERROR_EXIT
from primus.launch.plan import LaunchPlan
from primus.runtime.rundir import stop_after_write


@dataclass
class LaunchResult:
    exit_code: int
    failures: list[str]


class LauncherInterrupted(BaseException):
    """SIGTERM/SIGHUP reached the launcher outside its workers' own handling (while claiming the
    run dir, or before torchrun took over the signals). A BaseException, like KeyboardInterrupt,
    so that no ``except Exception`` in between swallows it."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"launcher got {signal.Signals(signum).name}")


class StopsRaise:
    """For the launcher's own code: TERM/HUP raise ``LauncherInterrupted`` (the default would kill
    the process before it can record the attempt's end). torchrun and an in-process worker install
    their own handlers while workers run; ``install()`` takes the signals back afterwards."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __enter__(self) -> "StopsRaise":
        self.previous = {sig: signal.getsignal(sig) for sig in self.SIGNALS}
        self.install()
        return self

    def install(self) -> None:
        for sig in self.SIGNALS:
            signal.signal(sig, self._raise)

    @staticmethod
    def _raise(signum, _frame) -> None:
        if stop_after_write(signum):  # a run-dir file is half-written: stop right after it
            return
        raise LauncherInterrupted(signum)

    def __exit__(self, *exc_info) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


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
        except (KeyboardInterrupt, SystemExit, LauncherInterrupted):
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


def _consequence_rank(failure) -> tuple:
    """Sort key putting the root cause first: ranks the agent SIGTERMed, or that only lost a
    peer's connection, failed because of another rank; otherwise earliest first."""
    message = failure.message if isinstance(failure.message, str) else str(failure.message or "")
    stopped_by_agent = failure.exitcode == -signal.SIGTERM
    lost_peer = "by peer" in message or "Connection closed" in message
    return (stopped_by_agent or lost_peer, failure.timestamp)


def _torchrun(plan: LaunchPlan, target: str, payload_path: Path) -> LaunchResult:
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(plan.torchrun_args(target, payload_path))
    if plan.nnodes == 1 and plan.max_restarts > 0:
        os.environ["PRIMUS_STATIC_RDZV"] = "1"  # see primus.runtime.worker.fresh_store_after_restart
    try:
        run(args)
    except (RendezvousError, DistError) as err:  # a node that never arrived, a wrong address, a port in use
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
        # the first failure refused the user's input (exit 2, its one line in the rank's log): so does the job
        root_cause = ordered[0][1].exitcode
        return LaunchResult(USER_ERROR_EXIT if root_cause == USER_ERROR_EXIT else 1, lines)
    return LaunchResult(0, [])
