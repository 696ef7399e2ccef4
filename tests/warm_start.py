"""A warm start for the tests' ``primus train`` runs: a server that has imported torch and one engine
once, and forks a child per run that becomes ``python -m primus.cli.main ARGS``.

Every CLI run of an e2e test paid the interpreter start and the imports of torch and its engine (4-10 s
of CPU) before doing anything; a 1-rank ``primus train`` runs its rank in the CLI process, so those
imports were its whole start-up. A server (one per engine and pytest process, started with a clean
``python``) imports its engine the way a run does: with Primus' logging as the CLI sets it before
an engine import, through Primus' adapter (Megatron's lazy-fusion finder, TorchTitan's triton
stand-in) and its recipes' modules. It then drops Primus' own modules, so each child imports Primus
afresh and computes its module state from its own environment and working directory.

A child is a fresh run in everything a test can see: its own session, the caller's environment,
working directory, argv and stdin, stdout/stderr on the caller's pipes at the descriptor level, its
exit status through the interpreter's own exit (atexit handlers, thread joins, flushes), and the
engine's import-time warnings held for the run's warning.log (``_hold_import_records``). What it
cannot be is a process whose imported modules read a different environment: the server records
every variable the preloaded modules read at import (``os.environ``/``os.getenv``, and the prefixes
of those that iterate it), and ``tests.helpers.run_cli`` forks a run only when the caller's
environment agrees with the server's on those, on ``INTERPRETER_START`` (read by C code or by the
interpreter at start), and its working directory is the server's; otherwise it starts a real process.

The ranks of a multi-rank run start the same way: torchrun runs ``PYTHON_EXEC -u -m MODULE ARGS`` per rank,
and ``tests.helpers.with_warm_ranks`` points PYTHON_EXEC at ``CLIENT``, which asks a server started with the
ranks' environment (torchrun's OMP_NUM_THREADS=1) for a child; the server makes the same comparison
(``differences``) against each rank's environment and working directory and refuses where they differ, and
the client then runs the real interpreter. Tests that look for rank processes by command line, or probe a
rank's interpreter start (a sitecustomize), run fresh (`fresh=True`).

Run as ``python -m tests.warm_start SOCKET ENGINE``: it prints one JSON line (what it recorded) when
ready, and serves until its stdin closes (its pytest process ended).
"""
from __future__ import annotations

import io
import json
import locale
import logging
import os
import re
import select
import socket
import sys
from pathlib import Path

# Read by C libraries when torch loads (OpenMP, MKL, torch's C++ static initialisers, allocators,
# collective libraries) or by the interpreter at start: invisible to the recording, compared whole.
# Not among them: PYTHONUNBUFFERED (the child's streams are made for it), PYTHON_EXEC (read by torchrun's
# Python code when it starts a worker) and what torchrun sets for its workers (TORCHELASTIC_*, read by
# Python code: recorded when read at import; TORCH_NCCL_ASYNC_ERROR_HANDLING, read when an NCCL group is made).
INTERPRETER_START = re.compile(r"^(?!TORCHELASTIC_|TORCH_NCCL_ASYNC_ERROR_HANDLING$)"
                               r"(PYTHON(?!UNBUFFERED$|_EXEC$)\w*|LANG|LANGUAGE|LC_\w+|TZ|LD_\w+|MALLOC_\w+|OMP_\w+|KMP_\w+|"
                               r"GOMP_\w+|MKL_\w+|OPENBLAS_\w+|TORCH\w*|PYTORCH_\w+|CUDA_\w+|HIP_\w+|ROC\w+|HSA_\w+|"
                               r"NCCL_\w+|RCCL_\w+|GLOO_\w+|TP_\w+|XDG_\w+|HOME|TMPDIR|PATH)$")
# Per engine, its modules that Primus imports and a tiny run of it imports (the rest come with them).
ENGINE_MODULES = {
    "torchtitan": ("torchtitan.trainer", "torchtitan.components.checkpointer.dcp", "torchtitan.components.dataloader",
                   "torchtitan.components.loss", "torchtitan.components.metrics", "torchtitan.components.optimizer",
                   "torchtitan.components.quantization.float8", "torchtitan.distributed.activation_checkpoint",
                   "torchtitan.distributed.fsdp", "torchtitan.distributed.parallel_dims",
                   "torchtitan.distributed.pipeline_parallel", "torchtitan.hf_datasets.text_datasets",
                   "torchtitan.models.common.attention", "torchtitan.models.common.moe", "torchtitan.models.llama3.model"),
    "megatron": ("megatron.core.models.gpt.gpt_layer_specs", "megatron.core.datasets.blended_megatron_dataset_builder",
                 "megatron.core.datasets.gpt_dataset", "megatron.core.dist_checkpointing.serialization",
                 "megatron.core.dist_checkpointing.strategies.async_utils", "megatron.core.distributed.fsdp.mcore_fsdp_adapter",
                 "megatron.core.distributed.torch_fully_sharded_data_parallel", "megatron.core.optimizer.distrib_optimizer",
                 "megatron.core.optimizer_param_scheduler", "megatron.core.pipeline_parallel", "megatron.core.tokenizers",
                 "megatron.core.transformer.fsdp_dtensor_checkpoint", "megatron.core.transformer.multi_token_prediction",
                 "megatron.core.num_microbatches_calculator", "megatron.core.rerun_state_machine"),
    "nemo_automodel": ("nemo_automodel.recipes.llm.train_ft", "nemo_automodel.recipes.diffusion.train",
                       "nemo_automodel.components.checkpoint.checkpointing", "nemo_automodel.components.config.loader"),
}
# What every run imports whatever its engine: the launcher's end-of-run plot of metrics.jsonl.
RUN_MODULES = ("matplotlib.pyplot",)


class _RecordingEnviron(os._Environ):
    """``os.environ`` over the same data, recording what modules other than Primus' read (Primus is
    imported afresh by each child) and who iterated it."""

    def __init__(self, real: os._Environ, reads: set[str], iterated: list[str]):
        super().__init__(real._data, real.encodekey, real.decodekey, real.encodevalue, real.decodevalue)
        self._reads, self._iterated = reads, iterated

    def _record(self, key) -> None:
        reader = sys._getframe(2)
        if reader.f_code.co_name == "__iter__" and reader.f_code.co_filename.startswith("<frozen"):
            return  # a mapping view's items()/values() iterating: recorded as the iteration it is (``__iter__``)
        if isinstance(key, str) and f"{os.sep}primus{os.sep}" not in _caller(reader).f_code.co_filename:
            self._reads.add(key)

    def __getitem__(self, key):
        self._record(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self._record(key)
        return super().__contains__(key)

    def __iter__(self):
        self._iterated.append(_caller(sys._getframe(1)).f_globals.get("__name__", "?"))
        return super().__iter__()


def _caller(frame):
    """The first frame outside ``os`` and the frozen ``collections.abc`` (``environ.get``, ``getenv``)."""
    while frame.f_back and (frame.f_code.co_filename.startswith("<frozen") or frame.f_globals.get("__name__") == "os"):
        frame = frame.f_back
    return frame


IMPORT_RECORDS: list[logging.LogRecord] = []  # what the engine logged at import, in the server

# Modules that read the environment by iterating it at import, and the prefix they look for.
ITERATED_PREFIXES = {"tqdm.utils": "TQDM_", "fsspec.config": "FSSPEC_", "networkx.utils.backends": "NETWORKX_",
                     "diffusers.utils.import_utils": "COLAB_"}


# Read at import for their presence only (mlflow's telemetry asks "under pytest?"); pytest rewrites this one's
# value for every phase of every test: compared whole, it made every run after a server's first test cold.
PRESENCE_ONLY = frozenset({"PYTEST_CURRENT_TEST"})


def differences(recorded: dict, start_env: dict[str, str], env: dict[str, str], cwd: str) -> list[str]:
    """Why a child for ``env`` in ``cwd`` would not be the process a fresh interpreter would be (empty: it
    would): the server's modules computed their state from ``start_env`` and its working directory."""
    if str(Path(cwd).resolve()) != recorded["cwd"]:
        return [f"cwd {cwd}"]
    set_by_import = recorded["reads"]  # what the imports read, as they left it (a default they set)

    def same(key: str) -> bool:  # a value the imports read, or the one they set for themselves when unset
        if key in PRESENCE_ONLY:
            return (key in env) == (key in start_env)
        return env.get(key) == start_env.get(key) or (key in set_by_import and env.get(key) == set_by_import[key])

    prefixes = tuple(recorded["prefixes"])  # read by iterating the environment at import
    started = {key for key in (*env, *start_env) if INTERPRETER_START.match(key) or key.startswith(prefixes)}
    return sorted(key for key in {*set_by_import, *started} if not same(key))


def _import_engine(engine: str) -> None:
    """What a run of ``engine`` imports before its first step, the way it imports it: through its
    Primus adapter first (its import shims), then the modules its recipes import."""
    import importlib

    import torch  # noqa: F401
    import torch.distributed.run  # noqa: F401  (the launcher's torchrun agent)
    from primus.runtime.registry import get_adapter

    adapter = get_adapter(engine)
    adapter.import_engine()
    for row in adapter.recipes:
        adapter._load(row)
    for name in (*ENGINE_MODULES[engine], *RUN_MODULES):
        importlib.import_module(name)


def _as_at_engine_import() -> logging.Filter:
    """The logging state a ``primus`` process has when it imports an engine (``primus.cli.main._main``
    before its handler runs): warnings and root-logger records held, torch's pytree deprecation
    filtered. What the engines log at import then lands in the held list, as in a real run."""
    from primus.logs.held import hold_records_until_logs_exist

    hold_records_until_logs_exist(verbose=False)
    pytree_filter = logging.Filter()
    pytree_filter.filter = lambda record: "register_constant() on Enum subclasses is deprecated" not in str(record.msg)
    logging.getLogger("torch.utils._pytree").addFilter(pytree_filter)
    return pytree_filter


def _forget_run_state(environ_before: dict[str, str], pytree_filter: logging.Filter) -> list[logging.LogRecord]:
    """Undo what ``_as_at_engine_import`` set up; returns the records held meanwhile: what the engine
    logged at import, which each child holds again (``_hold_import_records``) as a run would."""
    from primus.logs.held import _HeldRecords

    root = logging.getLogger()
    held = [handler for handler in root.handlers if isinstance(handler, _HeldRecords)]
    for handler in held:
        root.removeHandler(handler)
    logging.captureWarnings(False)
    logging.getLogger("torch.utils._pytree").removeFilter(pytree_filter)
    os.environ.clear()
    os.environ.update(environ_before)
    return [record for handler in held for record in handler.records]


def preload(engine: str) -> dict:
    """Import ``engine`` recording the environment it reads, hold what it logs; then forget Primus'
    own modules. Returns what was recorded, for the client's checks."""
    reads: set[str] = set()
    iterated: list[str] = []
    environ_before = dict(os.environ)
    real_environ = os.environ
    os.environ = _RecordingEnviron(real_environ, reads, iterated)
    try:
        pytree_filter = _as_at_engine_import()
        _import_engine(engine)
    finally:
        os.environ = real_environ
    environ_after = dict(os.environ)  # with what the imports set themselves (TORCHINDUCTOR_CACHE_DIR)
    IMPORT_RECORDS.extend(_forget_run_state(environ_before, pytree_filter))
    for name in [name for name in sys.modules if name == "primus" or name.startswith("primus.")]:
        del sys.modules[name]
    import threading

    return {"engine": engine, "cwd": os.getcwd(), "reads": {key: environ_after.get(key) for key in sorted(reads)},
            "prefixes": sorted({ITERATED_PREFIXES[module] for module in iterated if module in ITERATED_PREFIXES}),
            "unknown_iterations": sorted(set(iterated) - set(ITERATED_PREFIXES)),
            "held": [f"{record.name}: {record.getMessage()}"[:200] for record in IMPORT_RECORDS],
            "threads": [t.name for t in threading.enumerate()],
            "tasks": sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))}


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            raise EOFError("client left mid-request")
        data += more
    return json.loads(data), fds


def serve(path: str, recorded: dict, start_env: dict[str, str]) -> tuple[dict, list[int]] | None:
    """Accept runs until stdin closes; several may run at once (a launcher and its ranks). Returns in a
    forked run only: its request and descriptors. A request for a module (a rank a torchrun agent
    started through ``CLIENT``) is refused here when its environment or working directory would make a
    child differ from a fresh process (``differences``); the client then starts the real interpreter."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    print(json.dumps(recorded), flush=True)
    while True:
        while True:  # reap the waiters that ended
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        ready, _, _ = select.select([listener, sys.stdin], [], [], 5)
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):
            return None
        if listener not in ready:
            continue
        conn, _ = listener.accept()
        try:
            request, fds = _recv_request(conn)
        except (OSError, EOFError, ValueError):
            conn.close()
            continue
        why_not = differences(recorded, start_env, request["env"], request["cwd"]) if request.get("check") else []
        if why_not:  # in server.log: what made a rank start cold
            print(f"refused {request.get('module')}: differs in {why_not}", file=sys.stderr, flush=True)
            _reply(conn, {"refused": why_not})
        elif os.fork() == 0:  # the waiter: starts the run, reports its pid and exit status
            listener.close()
            run = _start_and_wait(conn, request, fds)
            if run is None:
                os._exit(0)
            return run
        for fd in fds:
            os.close(fd)
        conn.close()


def _reply(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass


def _start_and_wait(conn: socket.socket, request: dict, fds: list[int]) -> tuple[dict, list[int]] | None:
    """In a waiter: fork the run in its own session, send its pid, then its exit status. A client that
    goes away first (a torchrun agent SIGKILLed its rank's client) takes the run with it."""
    import signal

    started_r, started_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setsid()  # start_new_session: a timeout's killpg reaches the launcher and its workers
        os.close(started_r)
        os.close(started_w)
        conn.close()
        return request, fds
    os.close(started_w)
    os.read(started_r, 1)  # EOF once the run is in its own session (it closed the pipe)
    os.close(started_r)
    for fd in fds:
        os.close(fd)
    _reply(conn, {"pid": pid})
    try:
        ended = [os.pidfd_open(pid)]  # readable when the run ends
    except (AttributeError, OSError):  # a kernel before 5.3: look every second instead
        ended = []
    while True:
        ready, _, _ = select.select([*ended, conn], [], [], None if ended else 1.0)
        if (ended and ended[0] in ready) or (not ended and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)):
            break
        if conn in ready and not conn.recv(1 << 10):  # the client is gone
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            break
    _, status = os.waitpid(pid, 0)
    _reply(conn, {"returncode": os.waitstatus_to_exitcode(status)})
    return None


def _std_streams(unbuffered: bool) -> None:
    """sys.stdin/stdout/stderr as the interpreter makes them at start for these descriptors."""
    encoding = locale.getpreferredencoding(False)

    def text(fd: int, mode: str, errors: str, write_through: bool) -> io.TextIOWrapper:
        raw = io.open(fd, mode + "b", buffering=0 if (unbuffered and mode == "w") else -1, closefd=False)
        line_buffering = mode == "w" and os.isatty(fd)
        return io.TextIOWrapper(raw, encoding=encoding, errors=errors, line_buffering=line_buffering,
                                write_through=write_through)

    sys.stdin = sys.__stdin__ = text(0, "r", "strict", False)
    sys.stdout = sys.__stdout__ = text(1, "w", "strict", unbuffered)
    sys.stderr = sys.__stderr__ = text(2, "w", "backslashreplace", True)


def _hold_import_records() -> None:
    """Put what the engine logged at import (in the server) into this process's held records, where a
    fresh run's engine import puts them (they reach the run's warning.log). ``main`` then finds its
    holding handler installed (``hold_records_until_logs_exist`` installs one once); the runs this
    serves are not ``--verbose``, as the server's hold was not."""
    import time

    from primus.logs.held import _HeldRecords, hold_records_until_logs_exist

    hold_records_until_logs_exist(verbose=False)
    held = next(handler for handler in logging.getLogger().handlers if isinstance(handler, _HeldRecords))
    now = time.time()
    for record in IMPORT_RECORDS:
        record.created, record.msecs = now, (now - int(now)) * 1000
        record.relativeCreated = (now - logging._startTime) * 1000
        held.handle(record)


def become(request: dict, fds: list[int]) -> None:
    """In the forked run: this process becomes ``python [-u] -m MODULE ARGS`` (``primus.cli.main``
    unless the request names another module: a rank's ``primus.runtime.worker``)."""
    import importlib.util
    import runpy

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    module = request.get("module", "primus.cli.main")
    _std_streams(unbuffered=bool(request.get("unbuffered") or os.environ.get("PYTHONUNBUFFERED")))
    sys.argv = [importlib.util.find_spec(module).origin, *request["args"]]
    sys.orig_argv = [sys.executable, *(["-u"] if request.get("unbuffered") else []), "-m", module, *request["args"]]
    sys.path[0] = os.getcwd()  # what `python -m` puts first
    _hold_import_records()
    runpy.run_module(module, run_name="__main__", alter_sys=True)


# ``PYTHON_EXEC`` for a torchrun agent (read by ``torch.distributed.run``): each rank it starts as
# ``PYTHON_EXEC -u -m MODULE ARGS`` asks the warm server at PRIMUS_TEST_WARM_SOCKET for a child that becomes
# that rank, relays the agent's signals to it and exits as it did; anything else, or a refusal, runs the
# real interpreter. It imports only the standard library (-I -S: no site, no environment).
CLIENT = """#!{python} -IS
import json, os, signal, socket, sys
PYTHON = {python!r}
argv = sys.argv[1:]
path = os.environ.get("PRIMUS_TEST_WARM_SOCKET")
if not path or len(argv) < 3 or argv[:2] != ["-u", "-m"]:
    os.execv(PYTHON, [PYTHON, *argv])
import ctypes
ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: gone with the agent, as a real rank
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    conn.connect(path)
except OSError:
    os.execv(PYTHON, [PYTHON, *argv])
request = {{"module": argv[2], "args": argv[3:], "unbuffered": True, "check": True, "env": dict(os.environ),
           "cwd": os.getcwd()}}
socket.send_fds(conn, [json.dumps(request).encode() + b"\\n"], [0, 1, 2])
reader = conn.makefile("rb")
reply = json.loads(reader.readline() or b"{{}}")
if "pid" not in reply:
    conn.close()
    os.execv(PYTHON, [PYTHON, *argv])
pid = reply["pid"]
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT):
    signal.signal(sig, lambda signum, _frame: os.kill(pid, signum))
line = reader.readline()
code = json.loads(line)["returncode"] if line else 1
if code < 0:  # end as the rank did: by its signal, its default action
    if -code != signal.SIGKILL:
        signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code if code >= 0 else 128 - code)
"""


def write_client(folder: str) -> str:
    """The ``PYTHON_EXEC`` file for this interpreter, in ``folder``; its path."""
    path = os.path.join(folder, "python")
    with open(path, "w") as out:
        out.write(CLIENT.format(python=sys.executable))
    os.chmod(path, 0o755)
    return path


if __name__ == "__main__":
    sys.path[0] = os.getcwd()
    start_env = dict(os.environ)
    request = serve(sys.argv[1], preload(sys.argv[2]), start_env)
    if request is None:
        sys.exit(0)
    become(*request)
