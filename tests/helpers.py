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
def _one_rank_env() -> Iterator[None]:
    """RANK/LOCAL_RANK/WORLD_SIZE of a one-rank worker, for its duration only: left behind, they
    would reach every later subprocess of the session (a CLI would think it is rank 0 of a job)."""
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


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
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
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

    saved = dict(os.environ)
    out, err = io.StringIO(), io.StringIO()
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in argv])
            except SystemExit as exc:  # argparse
                code = int(exc.code or 0)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return subprocess.CompletedProcess(["primus", *map(str, argv)], code, out.getvalue(), err.getvalue())


def train_in_workspace(workspace: Path, tiny_cache: Path, example: Path, exp_name: str, *overrides: str) -> Path:
    """``primus train EXAMPLE exp_name=NAME OVERRIDES`` in a subprocess writing into ``workspace``, which
    it returns: a module fixture trains once and each test works on a copy of the run."""
    from tests.conftest import PRIMUS

    env = {**os.environ, "PRIMUS_WORKSPACE": str(workspace), "PRIMUS_CACHE": str(tiny_cache)}
    result = subprocess.run([*PRIMUS, "train", str(example), f"exp_name={exp_name}", *overrides], env=env,
                            capture_output=True, text=True, timeout=900)
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
