"""One way for tests to find a run's files and to train a module through the real worker path.

``train_worker`` (``primus.launch.rank``) is what every rank of ``primus train`` runs: it reads
``config.resolved.yaml``, rebuilds the adapter's plan and runs it. These helpers write that file
for a bare params dict, so engine tests exercise the same code as ``primus train`` without an
experiment file (no copy of the worker in the tests).
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parent.parent


def load_tool(name: str):
    """``tools/<name>.py`` as a module (tools/ is scripts, not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def run_dir_of(workspace: Path, exp_name: str, work_group: str = "amd", user_name: str = "root") -> Path:
    return Path(workspace) / work_group / user_name / exp_name


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The training-step records of a run's metrics.jsonl, oldest first ([] when none was written)."""
    from primus.runtime.metrics import is_step_row

    return [row for row in _rows(run_dir) if is_step_row(row)]


def read_events(run_dir: Path, kind: str | None = None) -> list[dict[str, Any]]:
    """The event records of a run's metrics.jsonl (``{"event": kind, ...}``), of one ``kind`` if given."""
    return [row for row in _rows(run_dir) if "event" in row and kind in (None, row["event"])]


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    from primus.runtime.metrics import read_rows
    from primus.runtime.rundir import RunDir

    return read_rows(RunDir(run_dir).metrics, kind=None)


def read_evals(run_dir: Path) -> list[dict[str, Any]]:
    """The validation passes (``"kind": "eval"`` rows) of a run's metrics.jsonl."""
    from primus.runtime.metrics import read_rows
    from primus.runtime.rundir import RunDir

    return read_rows(RunDir(run_dir).metrics, "eval")


def losses(run_dir: Path) -> list[float]:
    return [record["loss"] for record in read_metrics(run_dir)]


def write_run(run_dir: Path, framework: str, params: dict[str, Any], *, stage: str = "pretrain",
              module: str = "pre_trainer", resume: bool = False) -> Path:
    """A run dir holding ``config.resolved.yaml`` for one module and the worker's payload; returns the payload."""
    from primus.runtime.rundir import RunDir

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tree = {"work_group": "test", "user_name": "test", "exp_name": run_dir.name, "workspace": str(run_dir.parent),
            "modules": {module: {"framework": framework, "stage": stage, "config": None, "model": None,
                                 "params": params}}}
    RunDir(run_dir).write_config(tree)
    return RunDir(run_dir).write_payload(module=module, resume=resume, attempt="test")


@contextlib.contextmanager
def _restored_environ() -> Iterator[None]:
    """os.environ back as it is now after the block, whatever the block set or removed."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _one_rank_env() -> Iterator[None]:
    """RANK/LOCAL_RANK/WORLD_SIZE of a one-rank worker, and whatever the rank sets in its environment, for its
    duration only (a real rank's environment ends with it): left behind, a rank would reach every later
    subprocess of the session (a CLI would think it is rank 0 of a job), so would a rendezvous address an
    engine set (every later launch on one port), and the flight recorder's buffer size would move the
    environment the warm servers compare runs against."""
    with _restored_environ():
        os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"})
        yield


def _worker_in_process(run_dir: Path, framework: str, params: dict[str, Any], stage: str, resume: bool) -> int:
    """The real worker (``train_worker``) as one rank, in this process; its exit code."""
    from primus.launch.rank import train_worker

    payload = write_run(run_dir, framework, params, stage=stage, resume=resume)
    with _one_rank_env():
        return train_worker(json.loads(payload.read_text()))


def train_in_process(run_dir: Path, framework: str, params: dict[str, Any], *, stage: str = "pretrain",
                     resume: bool = False) -> list[dict[str, Any]]:
    """One rank, in this process (engines imported once per test session); returns the metrics."""
    assert _worker_in_process(run_dir, framework, params, stage, resume) == 0
    return read_metrics(run_dir)


def refused_in_process(run_dir: Path, framework: str, params: dict[str, Any], *, stage: str = "pretrain",
                       resume: bool = False) -> str:
    """Like ``train_in_process`` for a run the worker must refuse: exit 2, and the one error line it logged."""
    from primus.runtime.rundir import RunDir

    assert _worker_in_process(run_dir, framework, params, stage, resume) == 2
    errors = (RunDir(run_dir).logs("pre_trainer") / "rank-0" / "error.log").read_text().strip().splitlines()
    assert len(errors) == 1, errors
    return errors[0]


def train_with_torchrun(run_dir: Path, framework: str, params: dict[str, Any], *, nproc: int = 1,
                        stage: str = "pretrain", resume: bool = False, timeout: int = 300,
                        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``nproc`` ranks under ``torch.distributed.run`` running the real worker; the output is kept in
    ``run_dir/output.log``."""
    payload = write_run(run_dir, framework, params, stage=stage, resume=resume)
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                **(env or {})}
    # the agent and its ranks forked from a warm server where they would be the same process (tests/warm_start.py)
    full_env = with_warm_ranks(framework, full_env, Path.cwd())
    python = [full_env["PYTHON_EXEC"], "-u"] if "PYTHON_EXEC" in full_env else [sys.executable]
    command = [*python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "primus.runtime.worker", "primus.launch.rank:train_worker", str(payload)]
    result = subprocess.run(["timeout", "-k", "10", str(timeout), *command], capture_output=True, text=True,
                            env=full_env)
    (Path(run_dir) / "output.log").write_text(result.stdout + result.stderr)
    return result


def cli_in_process(*argv: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``primus ARGV`` in this process (engines imported once per session), with ``env`` for its
    duration: for commands that start no rank (validate, plan, --dry-run). Same result shape as a
    subprocess run."""
    import io

    from primus.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with _restored_environ(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse
            code = int(exc.code or 0)
    return subprocess.CompletedProcess(["primus", *map(str, argv)], code, out.getvalue(), err.getvalue())


def train_in_workspace(workspace: Path, tiny_cache: Path, example: Path, exp_name: str, *overrides: str) -> Path:
    """``primus train EXAMPLE exp_name=NAME OVERRIDES`` in a subprocess writing into ``workspace``, which
    it returns: a module fixture trains once and each test works on a copy of the run."""
    env = {**os.environ, "PRIMUS_WORKSPACE": str(workspace), "PRIMUS_CACHE": str(tiny_cache)}
    result = run_cli(["train", str(example), f"exp_name={exp_name}", *overrides], env=env, cwd=Path.cwd(), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return Path(workspace)


def exit_code_in_process(run_dir: Path, framework: str, params: dict[str, Any], *, stage: str = "pretrain",
                         resume: bool = False) -> int:
    """The worker's exit code for one rank in this process: for a run that ends otherwise than 0 by design
    (preempted: 75)."""
    return _worker_in_process(run_dir, framework, params, stage, resume)


def cli_in_workspace(workspace: Path, tiny_cache: Path, *argv: object) -> subprocess.CompletedProcess:
    """``cli_in_process`` with PRIMUS_WORKSPACE/PRIMUS_CACHE at ``workspace``/``tiny_cache`` (the ``run_primus``
    fixture's environment): for a command that starts no rank (a refusal, an export)."""
    env = {**os.environ, "PRIMUS_WORKSPACE": str(workspace), "PRIMUS_CACHE": str(tiny_cache)}
    return cli_in_process(*argv, env=env)


def primus_in_workspace(workspace: Path, tiny_cache: Path, *args: object, env: dict[str, str] | None = None,
                        timeout: int = 600) -> subprocess.CompletedProcess:
    """``primus ARGS`` in a subprocess writing into ``workspace``, its console kept: for a module fixture
    whose one run several tests read (``run_primus`` is per test)."""
    from tests.conftest import PRIMUS

    full_env = {**os.environ, "PRIMUS_WORKSPACE": str(workspace), "PRIMUS_CACHE": str(tiny_cache),
                "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([*PRIMUS, *map(str, args)], cwd=ROOT, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


# ---- ``primus ARGS`` as a process: fresh, or forked from a warm server (tests/warm_start.py) ----

CLI = [sys.executable, "-m", "primus.cli.main"]
_servers: dict[str, Any] = {}


def run_cli(args: list[str], *, env: dict[str, str], cwd: Path, timeout: float,
            fresh: bool = False) -> subprocess.CompletedProcess:
    """``python -m primus.cli.main ARGS`` with ``env`` in ``cwd``, in its own session (a timeout kills
    the launcher and its workers). A ``train`` run is forked from a warm server that imported its
    engine already, where that child would be the same process as a fresh one (``_warm_server``), and
    so are the ranks its torchrun agent starts (``with_warm_ranks``); ``fresh=True`` or
    ``PRIMUS_TEST_WARM=0`` always starts new interpreters."""
    args = [str(a) for a in args]
    if not fresh and _ranks_of(args) > 1 and "--verbose" not in args:
        env = with_warm_ranks(_engine_of(args, Path(cwd)), env, Path(cwd))
    server, why = (None, "asked fresh") if fresh else _warm_server(args, env, Path(cwd))
    _warm_log(f"{'warm' if server else 'fresh'} {' '.join(args)[:160]} :: {why}")
    if server is not None:
        return server.run(args, env, Path(cwd), timeout)
    process = subprocess.Popen([*CLI, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _warm_log(line: str) -> None:
    """One line in ``PRIMUS_TEST_WARM_LOG`` where it is set: which runs were forked warm and why not, which
    servers started, for whoever tunes the warm start."""
    if os.environ.get("PRIMUS_TEST_WARM_LOG"):
        with open(os.environ["PRIMUS_TEST_WARM_LOG"], "a") as log:
            log.write(f"{line}\n")


_FRAMEWORK = re.compile(r"\bframework\s*[:=]\s*[\"']?(torchtitan|megatron|nemo_automodel)\b")


def _engine_of(args: list[str], cwd: Path) -> str | None:
    """The one engine a ``train`` command names (its experiment file's ``framework:`` lines and its
    overrides), or None where it names none or several."""
    if not args or args[0] != "train":
        return None
    texts = [arg for arg in args[1:] if "framework" in arg]
    for arg in args[1:]:
        path = cwd / arg
        if arg.endswith((".yaml", ".yml")) and path.is_file():
            texts.append(path.read_text())
    engines = {match for text in texts for match in _FRAMEWORK.findall(text)}
    return engines.pop() if len(engines) == 1 else None


def _warm_server(args: list[str], env: dict[str, str], cwd: Path) -> tuple["WarmServer | None", str]:
    """The warm server that can run ``args`` as a fresh process would, or None and why not (names only)."""
    from tests.warm_start import differences

    if not _warm_wanted(args, env):
        return None, "asked fresh"
    engine = _engine_of(args, cwd)
    if engine is None:
        return None, "no one engine named"
    server = _servers.get(engine)
    if server is None or server.outdated_for(env, cwd, dict(os.environ)):
        started_for = "the first run" if server is None else _replacing(server, env, cwd)
        if server is not None:
            server.close()
        server = _servers[engine] = WarmServer(engine, why=started_for)
    if not server.usable:
        return None, "server unusable"
    why = differences(server.recorded, server.env, env, str(cwd))
    return (None, "differs in " + ",".join(why)) if why else (server, "")


def _replacing(server: "WarmServer", env: dict[str, str], cwd: Path) -> str:
    from tests.warm_start import differences

    return "one differing in " + ",".join(differences(server.recorded, server.env, env, str(cwd)) if server.usable
                                          else ["(unusable)"])


def _warm_wanted(args: list[str], env: dict[str, str]) -> bool:
    # --verbose: Hugging Face's progress bars are decided at their import, from the verbosity
    return os.environ.get("PRIMUS_TEST_WARM", "1") != "0" and "--verbose" not in args and not env.get("PRIMUS_VERBOSE")


_rank_servers: list["WarmServer"] = []
_RANK_SERVERS_PER_ENGINE = 2  # each holds an engine's imports in memory; a third start-up env runs cold


def with_warm_ranks(engine: str | None, env: dict[str, str], cwd: Path) -> dict[str, str]:
    """``env`` for a torchrun agent whose ranks (``-m primus.runtime.worker``) should be forked from a warm
    server of ``engine`` (``tests/warm_start.CLIENT``, through torchrun's ``PYTHON_EXEC``): the server was
    started with the environment the ranks get (torchrun's OMP_NUM_THREADS=1 where the agent has none),
    and refuses a rank whose environment would make its child differ from a fresh process."""
    if engine is None or not _warm_wanted([], env):
        return env
    rank_env = {"OMP_NUM_THREADS": "1", **env}
    server = next((s for s in _rank_servers if s.engine == engine and s.same_process_for(rank_env, cwd)), None)
    if server is None:  # one whose pytest process's environment moved since it started makes room for a new one
        current = {"OMP_NUM_THREADS": "1", **os.environ}
        outdated = next((s for s in _rank_servers if s.engine == engine and s.outdated_for(rank_env, cwd, current)),
                        None)
        replaced = _replacing(outdated, rank_env, cwd) if outdated is not None else None
        if outdated is not None:
            outdated.close()
            _rank_servers.remove(outdated)
    if server is None and sum(s.engine == engine for s in _rank_servers) < _RANK_SERVERS_PER_ENGINE:
        started_for = replaced or "; ".join(_replacing(s, rank_env, cwd) for s in _rank_servers
                                            if s.engine == engine) or "the first run"
        server = WarmServer(engine, env=rank_env, cwd=cwd, why=started_for)
        _rank_servers.append(server)
    if server is None or not server.usable:
        _warm_log(f"cold ranks of {engine} :: {'server unusable' if server else 'no server matches, none more'}")
        return env
    return {**env, "PYTHON_EXEC": server.client, "PRIMUS_TEST_WARM_SOCKET": str(server.folder / "socket")}


def torchrun_module(engine: str, nproc: int, module: str, *args: object,
                    timeout: int = 300) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node NPROC -m MODULE ARGS`` from the repo root, one OpenMP thread per
    rank, ``timeout`` seconds as a hang guard: for a test's own worker script (a module under tests/). Its ranks
    are forked from a warm server of ``engine`` where that is the same process (``with_warm_ranks``)."""
    env = with_warm_ranks(engine, {**os.environ, "OMP_NUM_THREADS": "1"}, ROOT)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", module, *map(str, args)]
    return subprocess.run(["timeout", "-k", "10", str(timeout), *command], capture_output=True, text=True, env=env,
                          cwd=ROOT)


def _ranks_of(args: list[str]) -> int:
    """The ranks per node a ``primus train`` command line asks for (1 where it names none)."""
    for position, arg in enumerate(args):
        if arg.startswith("--nproc-per-node="):
            value = arg.split("=", 1)[1]
        elif arg == "--nproc-per-node" and position + 1 < len(args):
            value = args[position + 1]
        else:
            continue
        return int(value) if value.isdigit() else 1
    return 1


class WarmServer:
    """One ``python -m tests.warm_start`` of this pytest process, with ``engine`` imported, started with
    ``env`` (this process's environment) in ``cwd``."""

    def __init__(self, engine: str, env: dict[str, str] | None = None, cwd: Path = ROOT, why: str = ""):
        import atexit
        import tempfile

        from tests.warm_start import write_client

        self.engine = engine
        self.folder = Path(tempfile.mkdtemp(prefix=f"primus-warm-{engine}-"))
        self.client = write_client(str(self.folder))
        # this process's environment now: what an engine's import in this process (importorskip) set is in it too
        self.env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
        with open(self.folder / "server.log", "w") as log:
            self.process = subprocess.Popen([*CLI[:1], "-m", "tests.warm_start", str(self.folder / "socket"), engine],
                                            cwd=cwd, env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=log, start_new_session=True)
        line = self.process.stdout.readline()
        self.recorded = json.loads(line) if line else None
        _warm_log(f"server {engine} {'for ranks' if env is not None else 'for the CLI'} in {os.getpid()} :: {why}")
        atexit.register(self.close)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()  # the server ends when its stdin does
            self.process.wait(timeout=30)
        if not os.environ.get("PRIMUS_TEST_WARM_LOG"):  # tuning: keep server.log (which ranks it refused, why)
            shutil.rmtree(self.folder, ignore_errors=True)

    @property
    def usable(self) -> bool:
        """It started, and nothing it imported read the environment in a way it could not record."""
        return bool(self.recorded) and not self.recorded["unknown_iterations"]

    def same_process_for(self, env: dict[str, str], cwd: Path) -> bool:
        """Would a child be the process ``python -m primus.cli.main`` with ``env`` in ``cwd`` would be? Its
        modules computed their state from the server's environment and working directory at import."""
        from tests.warm_start import differences

        return self.usable and not differences(self.recorded, self.env, env, str(cwd))

    def outdated_for(self, env: dict[str, str], cwd: Path, current: dict[str, str]) -> bool:
        """Would a child for ``env`` differ only because this pytest process's environment (``current``) moved
        since the server started (an in-process engine run set TORCHINDUCTOR_CACHE_DIR)? Then a server started
        now would match it, and the runs after it: replace this one rather than run cold from here on."""
        from tests.warm_start import differences

        if not self.usable or str(Path(cwd).resolve()) != self.recorded["cwd"]:
            return False
        keys = differences(self.recorded, self.env, env, str(cwd))
        return bool(keys) and all(env.get(key) == current.get(key) for key in keys)

    def run(self, args: list[str], env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
        import selectors
        import socket
        import time

        command = [*CLI, *args]
        request = {"args": args, "env": env, "cwd": str(cwd)}
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(str(self.folder / "socket"))
            reply_fd = conn.fileno()
            try:
                socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [0, out_w, err_w])
            finally:
                os.close(out_w)
                os.close(err_w)
            chunks: dict[int, list[bytes]] = {out_r: [], err_r: [], reply_fd: []}
            selector = selectors.DefaultSelector()
            for fd in chunks:
                selector.register(fd, selectors.EVENT_READ)
            deadline, pid, timed_out = time.monotonic() + timeout, None, False
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0 and timed_out:
                    break  # a rank's own child (not in this session, its rank gone) still holds the pipes
                if left <= 0:
                    timed_out, deadline = True, deadline + 30
                    if pid is not None:
                        os.killpg(pid, signal.SIGKILL)
                for key, _ in selector.select(timeout=max(left, 0.01)):
                    data = os.read(key.fd, 1 << 16)
                    if not data:
                        selector.unregister(key.fd)
                        continue
                    chunks[key.fd].append(data)
                    if key.fd == reply_fd and pid is None and b"\n" in b"".join(chunks[key.fd]):
                        pid = json.loads(b"".join(chunks[key.fd]).split(b"\n")[0])["pid"]
                        if timed_out:
                            os.killpg(pid, signal.SIGKILL)
            selector.close()
        os.close(out_r)
        os.close(err_r)
        replies = [json.loads(line) for line in b"".join(chunks.pop(reply_fd)).splitlines()]
        stdout, stderr = (_text(b"".join(chunks[fd])) for fd in (out_r, err_r))
        if timed_out:
            raise subprocess.TimeoutExpired(command, timeout, stdout, stderr)
        if len(replies) != 2:
            raise RuntimeError(f"warm server {self.folder} ended mid-run: {replies}")
        return subprocess.CompletedProcess(command, replies[1]["returncode"], stdout, stderr)


def _text(data: bytes) -> str:
    """As ``Popen(text=True)`` decodes a pipe."""
    import locale

    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")
