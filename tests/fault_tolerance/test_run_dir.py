"""The run dir's bookkeeping survives faults. Launcher failures are one line.

- a damaged manifest is refused with a clear line and a backup copy of the last good one;
- an attempt whose launcher died is recorded as interrupted; a stop signal never lands
  half-way through a manifest write, and one that arrives while the attempt is opened is
  recorded as an interruption (never ``status: running`` forever);
- a metrics.jsonl deleted mid-run is reopened with a warning;
- exit codes and run-dir file names are spelled in one place; launch/ has no import cycle.
"""
from __future__ import annotations

import ast
import json
import logging
import os
import re
import signal
from pathlib import Path

import pytest

from primus.config.errors import ConfigError
from primus.runtime.metrics import StepReport
from primus.runtime.reporter import MetricsReporter
from primus.runtime.rundir import INTERRUPTED, ExitCode, RunDir
from tests.conftest import ROOT, TINY_EXAMPLE

PACKAGE = ROOT / "primus"


def _attempt(run_dir: RunDir, argv=("primus", "train", "x.yaml")) -> None:
    run_dir.start_attempt(engine="torchtitan", engine_version="0", world_size=1, config_hash="h", argv=list(argv))


def test_a_damaged_manifest_is_refused_and_the_last_good_copy_is_kept(tmp_path):
    run_dir = RunDir(tmp_path / "run")
    run_dir.create()
    _attempt(run_dir)
    run_dir.finish_attempt(ExitCode.COMPLETED)
    good = run_dir.manifest.read_text()
    run_dir.manifest.write_text(good[: len(good) // 2])  # truncated (a copy cut short, a full disk)
    with pytest.raises(ConfigError) as refused:
        run_dir.decide_resume("auto")
    message = str(refused.value)
    assert f"{run_dir.manifest}: damaged (JSONDecodeError" in message
    assert f"the last good copy is {run_dir / RunDir.MANIFEST_BACKUP}" in message
    assert (run_dir / RunDir.MANIFEST_BACKUP).read_text() == good
    with pytest.raises(ConfigError):  # nor can a new attempt bypass the completed-run refusal
        _attempt(run_dir)
    run_dir.manifest.write_text(good)  # restored as the message says: the policy holds again
    with pytest.raises(ConfigError, match="already holds a completed run"):
        run_dir.decide_resume("auto")


def test_an_attempt_whose_launcher_died_is_recorded_as_interrupted(tmp_path):
    RunDir(tmp_path).create()
    _attempt(RunDir(tmp_path))  # ... and the launcher is SIGKILLed: nothing records the end
    run_dir = RunDir(tmp_path)
    assert run_dir.decide_resume("auto") is True
    _attempt(run_dir)
    run_dir.finish_attempt(ExitCode.PREEMPTED)
    attempts = run_dir.read_manifest()["attempts"]
    assert [a["status"] for a in attempts] == [INTERRUPTED, "preempted"]
    assert "ended without recording an end" in attempts[0]["note"]


def test_a_stop_signal_during_a_manifest_write_is_delivered_after_it(tmp_path, monkeypatch):
    """With the launcher's own handler, and another thread for the kernel to deliver the signal
    to (torch starts several), as in the launcher."""
    import threading

    from primus.launch.local import LauncherInterrupted, StopsRaise

    run_dir = RunDir(tmp_path)
    run_dir.create()
    real_write = Path.write_text
    other = threading.Event()
    threading.Thread(target=other.wait, daemon=True).start()

    def write_then_signal(self, *args, **kwargs):  # SIGTERM arrives in the middle of the write
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # bytecodes: a handler that was not held back runs right here
            pass
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_then_signal)
    try:
        with StopsRaise(), pytest.raises(LauncherInterrupted):
            _attempt(run_dir)
    finally:
        other.set()
        monkeypatch.undo()
    assert run_dir.read_manifest(strict=True)["attempts"][-1]["status"] == "running"  # written whole
    assert run_dir.attempt == 0  # the launcher knows which attempt to close


def test_sigterm_while_the_attempt_opens_is_recorded_as_an_interruption(tmp_path, tiny_cache, monkeypatch, capsys):
    from primus.cli.main import main

    monkeypatch.setenv("PRIMUS_WORKSPACE", str(tmp_path / "ws"))
    monkeypatch.setenv("PRIMUS_CACHE", str(tiny_cache))
    real_start = RunDir.start_attempt

    def start_then_terminated(self, **kwargs):
        real_start(self, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # the scheduler stops the job right now

    monkeypatch.setattr(RunDir, "start_attempt", start_then_terminated)
    before = signal.getsignal(signal.SIGTERM)
    code = main(["train", str(TINY_EXAMPLE), "exp_name=stopped", "training.steps=1"])
    assert signal.getsignal(signal.SIGTERM) is before  # the launcher's handlers are gone again
    err = capsys.readouterr().err
    assert code == 128 + signal.SIGTERM
    assert [line for line in err.splitlines() if "FAILED" in line] == [
        line for line in err.splitlines() if "launcher got SIGTERM before its workers ended" in line]
    assert "Traceback" not in err
    run_dir = RunDir(tmp_path / "ws" / "amd" / "root" / "stopped")
    manifest = run_dir.read_manifest(strict=True)
    assert manifest["status"] == INTERRUPTED and manifest["exit_code"] == 143
    assert manifest["attempts"][-1]["note"] == "launcher got SIGTERM"
    with run_dir.lock():  # released: the same command can run again
        assert run_dir.decide_resume("auto") is True


def test_a_launcher_failure_is_one_failed_line_and_a_recorded_end(tmp_path, tiny_cache, monkeypatch, capsys):
    from primus.cli.main import main
    from primus.launch import job

    monkeypatch.setenv("PRIMUS_WORKSPACE", str(tmp_path / "ws"))
    monkeypatch.setenv("PRIMUS_CACHE", str(tiny_cache))

    def broken(*_args, **_kwargs):
        raise RuntimeError("the agent could not start")

    monkeypatch.setattr(job, "launch_workers", broken)
    code = main(["train", str(TINY_EXAMPLE), "exp_name=broken", "training.steps=1"])
    err = capsys.readouterr().err
    assert code == ExitCode.FAILED and "Traceback" not in err
    failed = [line for line in err.splitlines() if line.startswith("[primus] FAILED")]
    assert len(failed) == 1 and "launcher error on node 0: RuntimeError: the agent could not start" in failed[0]
    run_dir = RunDir(tmp_path / "ws" / "amd" / "root" / "broken")
    assert "RuntimeError" in (run_dir.logs() / "launcher-node0-error.log").read_text()
    assert run_dir.read_manifest()["status"] == "failed"


def test_a_deleted_metrics_file_is_reopened_with_a_warning(tmp_path, caplog):
    reporter = MetricsReporter(tmp_path, rank=0, world_size=1, device="cpu", peak_tflops=None,
                               enable_tensorboard=False)
    step = lambda n: StepReport(step=n, loss=1.0, step_time_s=0.1, samples=1)  # noqa: E731
    reporter.report(step(1))
    RunDir(tmp_path).metrics.unlink()  # a user's cleanup script, mid-run
    with caplog.at_level(logging.WARNING, logger="primus.metrics"):
        reporter.report(step(2))
        reporter.report(step(3))
    reporter.close()
    assert [json.loads(line)["step"] for line in RunDir(tmp_path).metrics.read_text().splitlines()] == [2, 3]
    warnings = [r.getMessage() for r in caplog.records if "was deleted during the run" in r.getMessage()]
    assert len(warnings) == 1 and "metrics.jsonl" in warnings[0]


# --- structure: one place for the constants, no import cycle in launch/ ----------------------------
RUN_DIR_NAMES = {RunDir.CONFIG, RunDir.MANIFEST, RunDir.MANIFEST_BACKUP, RunDir.PAYLOAD, RunDir.METRICS,
                 RunDir.PREEMPTED_MARKER, RunDir.LOCK}


def _code_constants(path: Path) -> list:
    """Constants in code (docstrings, which explain, are left out)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and id(node) not in docstrings]


def test_exit_codes_and_run_dir_names_are_spelled_in_one_place():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path == PACKAGE / "runtime" / "rundir.py":
            continue
        for value in _code_constants(path):
            if type(value) is int and value == ExitCode.PREEMPTED:
                offenders.append(f"{path.relative_to(ROOT)}: {value}")
            if isinstance(value, str) and any(name in value for name in RUN_DIR_NAMES):
                offenders.append(f"{path.relative_to(ROOT)}: {value!r}")
    for path in [*PACKAGE.rglob("*.j2"), *PACKAGE.rglob("*.sh")]:
        text = path.read_text()
        if re.search(r"\b75\b", text) or any(name in text for name in RUN_DIR_NAMES):
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders


def _imports(path: Path, package: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(package):
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith(package)}
    return found


def test_launch_has_no_import_cycle():
    modules = {f"primus.launch.{p.stem}": p for p in (PACKAGE / "launch").glob("*.py") if p.stem != "__init__"}
    graph = {name: {dep for dep in _imports(path, "primus.launch") if dep in modules and dep != name}
             for name, path in modules.items()}
    visiting, done = set(), set()

    def visit(name, trail):
        assert name not in visiting, " -> ".join([*trail, name])
        if name in done:
            return
        visiting.add(name)
        for dep in graph[name]:
            visit(dep, [*trail, name])
        visiting.discard(name)
        done.add(name)

    for name in graph:
        visit(name, [])
    assert "primus.launch.multinode" not in graph["primus.launch.local"]
