"""The run directory ``{workspace}/{work_group}/{user_name}/{exp_name}/`` and everything Primus keeps in it.

``RunDir`` is the one place that knows the directory's file names, its lock, its manifest
(every launch is an attempt: start, end, status, restarts), its markers and the exit codes.

Policy (``--resume``, default ``auto``): a run directory belongs to one run.
- ``auto``: a new directory starts a run; an interrupted one (failed, preempted, killed)
  is resumed from its latest checkpoint; a completed one is refused (exit 2).
- ``always`` (bare ``--resume``): continue it even if it completed (e.g. with more steps).
- ``never``: refuse any existing run.
A lock file stops two launches of the same experiment from writing into one directory at
once. Nothing the user made is overwritten or deleted.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from enum import IntEnum
from pathlib import Path
from typing import Any, Iterator

import yaml

import primus
from primus.config.errors import USER_ERROR_EXIT, ConfigError
from primus.config.secrets import redact_argv


class ExitCode(IntEnum):
    """The exit status of ``primus train`` (and of each node's launcher)."""

    COMPLETED = 0
    FAILED = 1  # a rank (or the launcher) failed; the launcher names the first failing rank
    BAD_INPUT = USER_ERROR_EXIT  # a user error (ConfigError): one line per mistake, nothing written
    PREEMPTED = 75  # EX_TEMPFAIL, "try again": SIGTERM made every rank checkpoint and stop

    @staticmethod
    def status_of(code: int) -> str:
        """The manifest status an exit status stands for."""
        return {ExitCode.COMPLETED: "completed", ExitCode.PREEMPTED: "preempted"}.get(code, "failed")


RESUME_MODES = ("auto", "always", "never")
INTERRUPTED = "interrupted"  # manifest status of an attempt whose launcher was stopped before its workers ended


def _now() -> str:
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_writing = {"depth": 0, "pending": []}  # run-dir files being replaced, and the stops that came meanwhile


def stop_after_write(signum: int) -> bool:
    """For a Python signal handler that would stop the process: True when a run-dir file is being
    replaced right now, in which case the signal is raised again as soon as the write is complete
    (the handler should then return and do nothing)."""
    if _writing["depth"]:
        _writing["pending"].append(signum)
        return True
    return False


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold back TERM/INT/HUP while a file is replaced, so a stop never lands half-way; they are
    delivered (and handled) right after. The mask covers a stop with no Python handler in this
    thread; ``stop_after_write`` covers Python handlers, which the interpreter runs in the main
    thread whichever thread (torch starts several) the kernel delivered the signal to."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, set(_STOPS))
    _writing["depth"] += 1
    try:
        yield
    finally:
        _writing["depth"] -= 1
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        if not _writing["depth"]:
            pending, _writing["pending"] = _writing["pending"], []
            for signum in dict.fromkeys(pending):
                signal.raise_signal(signum)


def _replace_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with _signals_held():
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)


class RunDir:
    """One experiment's run directory: paths, lock, resume policy, manifest, markers."""

    CONFIG = "config.resolved.yaml"  # written once per launch by node 0; workers read it
    MANIFEST = "manifest.json"
    MANIFEST_BACKUP = "manifest.last-good.json"  # the manifest as last written, if the live one is damaged
    PAYLOAD = "launch.json"  # what each worker is told: run dir, module, resume, attempt
    METRICS = "metrics.jsonl"
    PREEMPTED_MARKER = "preempted.json"  # written by global rank 0 when it stopped on SIGTERM with a checkpoint
    LOCK = ".primus.lock"

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.attempt: int | None = None  # index of the attempt this process opened in the manifest

    @classmethod
    def of(cls, spec) -> "RunDir":
        """``{workspace}/{work_group}/{user_name}/{exp_name}``, refused if it would leave the workspace."""
        workspace = Path(spec.workspace).expanduser().absolute()
        path = workspace / spec.work_group / spec.user_name / spec.exp_name
        normal = Path(os.path.normpath(path))
        if normal.parent.parent.parent != Path(os.path.normpath(workspace)) or normal.name in ("", ".", ".."):
            raise ConfigError(f"work_group/user_name/exp_name: {spec.work_group}/{spec.user_name}/{spec.exp_name} "
                              f"would leave the workspace {workspace}")
        return cls(normal)

    def __str__(self) -> str:
        return str(self.path)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    # --- paths ---------------------------------------------------------------------------
    @property
    def config(self) -> Path:
        return self.path / self.CONFIG

    @property
    def manifest(self) -> Path:
        return self.path / self.MANIFEST

    @property
    def payload(self) -> Path:
        return self.path / self.PAYLOAD

    @property
    def metrics(self) -> Path:
        return self.path / self.METRICS

    @property
    def preempted_marker(self) -> Path:
        return self.path / self.PREEMPTED_MARKER

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def nodes(self) -> Path:
        return self.path / "nodes"

    def logs(self, module: str | None = None) -> Path:
        return self.path / "logs" / module if module else self.path / "logs"

    # --- creation, lock, resume policy ---------------------------------------------------
    def create(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(f"workspace: cannot write run directory {self.path} ({exc.strerror})") from None

    def lock(self) -> "RunDirLock":
        return RunDirLock(self.path / self.LOCK)

    def decide_resume(self, mode: str) -> bool:
        """Apply the resume policy (to a locked run directory, or before queueing a job); True when resuming."""
        if mode not in RESUME_MODES:
            raise ConfigError(f"--resume {mode}: expected one of {', '.join(RESUME_MODES)}")
        previous = self.read_manifest(strict=True)
        if not previous:
            return False
        status, started = previous.get("status", "?"), previous.get("start_time", "?")
        if mode == "never" or (mode == "auto" and status == "completed"):
            hint = "pass --resume to continue it" if status == "completed" else "drop --no-resume to resume it"
            raise ConfigError(f"{self.path}: already holds a {status} run (started {started}); {hint}, "
                              "or set another exp_name")
        return True

    # --- resolved config and payload -----------------------------------------------------
    def write_config(self, tree: dict[str, Any]) -> str:
        """Write the resolved config (secrets as ``${VAR}`` references); return its sha256."""
        text = yaml.safe_dump(tree, sort_keys=False, default_flow_style=False)
        _replace_atomically(self.config, text)
        return hashlib.sha256(text.encode()).hexdigest()

    def read_config(self) -> dict[str, Any]:
        return yaml.safe_load(self.config.read_text(encoding="utf-8"))

    def read_module(self, name: str | None = None) -> tuple[str, dict[str, Any]]:
        """(name, section) of one module of ``config.resolved.yaml`` (default ``pre_trainer``), for a
        reader of a finished run (``primus export``): a damaged file (empty, not YAML, not a mapping,
        a module without its framework or params) is one ``ConfigError`` naming it."""
        from primus.config.yaml_source import read_yaml

        where = str(self.config)
        if not self.config.is_file():
            raise ConfigError(f"{self.path}: not a Primus run directory (no {self.CONFIG})")
        tree = read_yaml(self.config, where)
        damaged = f"{where}: damaged (written by Primus at launch; restore it from a copy, or re-launch the run)"
        if not isinstance(tree, dict) or not tree:
            raise ConfigError(f"{damaged}: {'empty' if not tree else f'a {type(tree).__name__}, not a mapping'}")
        modules = tree.get("modules")
        if not isinstance(modules, dict) or not modules:
            raise ConfigError(f"{damaged}: no 'modules' mapping")
        if name is None:
            name = "pre_trainer" if "pre_trainer" in modules else next(iter(modules))
        if name not in modules:
            raise ConfigError(f"--module {name}: no such module in the run (modules: {', '.join(map(str, modules))})")
        section = modules[name]
        if not isinstance(section, dict):
            raise ConfigError(f"{damaged}: modules.{name} is not a mapping")
        for key, kind in (("framework", str), ("params", dict)):
            if not isinstance(section.get(key), kind):
                raise ConfigError(f"{damaged}: modules.{name}.{key} is missing or not a {kind.__name__}")
        return name, section

    def write_payload(self, *, module: str, resume: bool, attempt: str) -> Path:
        _replace_atomically(self.payload, json.dumps({"run_dir": str(self.path), "module": module, "resume": resume,
                                                      "attempt": attempt}))
        return self.payload

    def read_payload(self) -> dict[str, Any]:
        return _read_json(self.payload)

    # --- manifest --------------------------------------------------------------------------
    def read_manifest(self, *, strict: bool = False) -> dict[str, Any]:
        """The manifest, ``{}`` when there is none. A damaged one is refused when ``strict``
        (the resume policy must not be bypassed by a truncated file), else read as ``{}``."""
        try:
            text = self.manifest.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            if strict:
                raise ConfigError(f"{self.manifest}: cannot read ({exc.strerror})") from None
            return {}
        try:
            manifest = json.loads(text)
            if not isinstance(manifest, dict):
                raise ValueError("not an object")
            return manifest
        except (ValueError, UnicodeDecodeError) as exc:
            if not strict:
                return {}
            backup = self.path / self.MANIFEST_BACKUP
            hint = (f"the last good copy is {backup}: restore it (cp {backup} {self.manifest})" if backup.is_file()
                    else "there is no backup copy: move the file away to start the history anew")
            raise ConfigError(f"{self.manifest}: damaged ({type(exc).__name__}: {str(exc)[:80]}); "
                              f"{hint}, or set another exp_name") from None

    def _write_manifest(self, manifest: dict[str, Any]) -> None:
        text = json.dumps(manifest, indent=2, sort_keys=False)
        _replace_atomically(self.manifest, text)
        _replace_atomically(self.path / self.MANIFEST_BACKUP, text)

    def start_attempt(self, *, engine: str, engine_version: str | None, world_size: int, config_hash: str,
                      argv: list[str]) -> None:
        """Record a new attempt as ``running`` (argv is kept with secrets redacted). An earlier attempt
        still ``running`` lost its launcher (SIGKILL, node loss): it is recorded as interrupted."""
        argv = redact_argv(argv)
        manifest = self.read_manifest(strict=True)
        attempts = manifest.setdefault("attempts", [])
        if attempts and attempts[-1].get("status") == "running":
            attempts[-1].update({"status": INTERRUPTED, "note": "its launcher ended without recording an end "
                                 "(killed?)"})
        attempt = {"start_time": _now(), "wall_start": _process_start(), "command": argv, "world_size": world_size,
                   "status": "running"}
        manifest.update({
            "primus": primus.__version__, "python": platform.python_version(), "torch": _version("torch"),
            "engine": engine, "engine_version": engine_version, "git_sha": _git_sha(),
            "host": socket.gethostname(), "command": argv, "world_size": world_size, "config_sha256": config_hash,
            "status": "running", "pid": os.getpid(), "executable": sys.executable,
        })
        manifest.setdefault("start_time", attempt["start_time"])
        attempts.append(attempt)
        self.attempt = len(attempts) - 1  # before writing: a signal delivered right after must find it
        self._write_manifest(manifest)

    def record_restart(self, restart: int, world_size: int | None = None) -> int | None:
        """Called by rank 0 of a worker group that torchelastic restarted; returns the world size the group
        had before (None if unknown): an elastic restart may go on with fewer nodes."""
        manifest = self.read_manifest()
        if not manifest.get("attempts"):
            return None
        attempt = manifest["attempts"][-1]
        before = next((r["world_size"] for r in reversed(attempt.get("restarts", [])) if "world_size" in r),
                      attempt.get("world_size", manifest.get("world_size")))
        entry = {"restart": restart, "time": _now(), "time_unix": time.time(),
                 **({"world_size": world_size} if world_size else {})}
        attempt.setdefault("restarts", []).append(entry)
        self._write_manifest(manifest)
        return before

    def finish_attempt(self, exit_code: int, status: str | None = None, note: str | None = None) -> None:
        """Record the end of the attempt this process opened (nothing if it never opened one)."""
        manifest = self.read_manifest()  # workers may have recorded restarts meanwhile
        attempts = manifest.get("attempts") or []
        if self.attempt is None or self.attempt >= len(attempts):
            return
        status = status or ExitCode.status_of(exit_code)
        end = {"end_time": _now(), "exit_code": int(exit_code), "status": status}
        manifest.update(end)
        attempts[self.attempt].update(end, wall_end=time.time(), **({"note": note} if note else {}))
        self._write_manifest(manifest)

    def record_goodput(self) -> dict[str, Any]:
        """The run's goodput over every attempt so far (``primus.runtime.goodput``): kept in the
        manifest and as an event in metrics.jsonl."""
        from primus.runtime.goodput import account

        manifest = self.read_manifest()
        summary = account(manifest.get("attempts") or [], self.read_metrics(), time.time())
        manifest["goodput"] = {k: v for k, v in summary.items() if k != "event"}
        self._write_manifest(manifest)
        if self.metrics.exists():  # a run refused before its first step keeps no metrics file
            self.append_event(summary)
        return summary

    # --- metrics.jsonl ---------------------------------------------------------------------
    def read_metrics(self) -> list[dict[str, Any]]:
        """Every row of metrics.jsonl: steps, and events (``{"event": ...}``); a torn last line is skipped."""
        try:
            lines = self.metrics.read_text(encoding="utf-8").splitlines()
        except OSError:
            return []
        rows = []
        for text in lines:
            try:
                rows.append(json.loads(text))
            except ValueError:
                continue
        return rows

    def append_event(self, event: dict[str, Any]) -> None:
        """One event row (``{"event": kind, ...}``) at the end of metrics.jsonl, in one write: the
        launcher and rank 0 may both append."""
        with self.metrics.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(event) + "\n")

    # --- markers ---------------------------------------------------------------------------
    def mark_preempted(self, step: int, checkpointed: bool) -> None:
        self.preempted_marker.write_text(json.dumps({"step": step, "checkpointed": checkpointed}))

    def clear_preempted(self) -> None:
        self.preempted_marker.unlink(missing_ok=True)

    def outcome(self, exit_code: int) -> int:
        """A failed worker group whose rank 0 stopped on SIGTERM with a checkpoint was preempted."""
        if exit_code != ExitCode.COMPLETED and self.preempted_marker.exists():
            return ExitCode.PREEMPTED
        return exit_code


class RunDirLock:
    """An exclusive, non-blocking flock on the run directory for the life of the launch."""

    def __init__(self, path: Path):
        self.path = path
        self.handle = None

    def __enter__(self) -> "RunDirLock":
        self.handle = self.path.open("a+")
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.handle.seek(0)
            holder = self.handle.read().strip() or "another process"
            self.handle.close()
            raise ConfigError(f"{self.path.parent}: another launch is running this experiment ({holder}); "
                              "wait for it or choose another exp_name") from None
        self.handle.seek(0)
        self.handle.truncate()
        self.handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {_now()}")
        self.handle.flush()
        return self

    def __exit__(self, *exc_info) -> None:
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()


def reopen_if_deleted(handle, path: Path, on_reopen) -> Any:
    """``handle`` (appending to ``path``), or a fresh one when the file was deleted under it;
    ``on_reopen(path)`` is told once per reopening. One ``fstat`` per call."""
    if handle is None or os.fstat(handle.fileno()).st_nlink > 0:
        return handle
    handle.close()
    on_reopen(path)
    return path.open("a", encoding="utf-8")


def _process_start() -> float:
    """When this process (the launcher) started: its start-up counts in the run's wall time."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:
        return time.time()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(primus.__file__).parent,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
