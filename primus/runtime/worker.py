"""Per-process entry point: ``python -m primus.runtime.worker TARGET PAYLOAD.json``.

The launcher starts this in every rank (through ``torch.distributed.run``) or calls
``run_target`` in-process for a single process. ``TARGET`` is ``package.module:function``
taking the payload dict and returning an exit status. ``@record`` makes torchelastic write a
failing rank's traceback to its error file, so the launcher can name the rank that broke.
"""
from __future__ import annotations

import atexit
import importlib
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn


def run_target(target: str, payload: dict[str, Any]) -> int:
    module_name, _, function_name = target.partition(":")
    function = getattr(importlib.import_module(module_name), function_name)
    return int(function(payload) or 0)


def die_with_parent() -> None:
    """Linux: SIGKILL this worker when its launcher dies, whatever killed the launcher. A worker
    stuck in a C-level collective cannot run Python signal handlers, so without this a launcher
    killed by a timeout would leave it running forever (and squatting on its ports)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        return
    if os.getppid() == 1:  # the launcher died before we got here
        os._exit(137)


def fresh_store_after_restart() -> None:
    """torch 2.13's static rendezvous keeps ONE TCPStore for every torchelastic restart, so a
    restarted worker group's process group reads the previous attempt's keys (dead peer
    addresses -> gloo "Connection refused" or a stall). On a restart of a single-node static
    launch (the launcher sets PRIMUS_STATIC_RDZV), rank 0 hosts a fresh store on
    MASTER_PORT + restart instead of reusing the agent's."""
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if restart and os.environ.get("PRIMUS_STATIC_RDZV") == "1" and os.environ.get("MASTER_PORT"):
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"
        os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + restart)


def end_process(code: int) -> NoReturn:
    """End this rank as ``multiprocessing`` ends the children it forks (``BaseProcess._bootstrap``):
    ``threading._shutdown`` (the threading atexit hooks, e.g. idle executor workers told to stop, then a
    join of every non-daemon thread), the atexit callbacks (trackers, log handlers, an engine's own
    teardown), a flush, then ``os._exit``.

    Interpreter finalization is skipped on purpose: a process group still referenced from C++ (a gloo
    group a device mesh holds, with a collective never waited on) is destroyed there, and gloo then
    aborts the process ("terminate called without an active exception", SIGABRT) after a run that
    succeeded, so torchrun reports the rank as failed. Seen about once per few hundred CPU ranks."""
    threading._shutdown()  # private, as multiprocessing calls it: what finalization runs first
    atexit._run_exitfuncs()  # includes logging.shutdown
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken: nothing left to save
            pass
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import record

    die_with_parent()
    fresh_store_after_restart()
    argv = sys.argv[1:] if argv is None else argv
    target, payload_path = argv[0], Path(argv[1])
    payload = json.loads(payload_path.read_text())
    return record(run_target)(target, payload)


if __name__ == "__main__":
    end_process(main())
