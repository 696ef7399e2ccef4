"""The run directory ``{workspace}/{work_group}/{user_name}/{exp_name}/`` and its manifest.

Policy (``--resume``, default ``auto``): a run directory belongs to one run.
- ``auto``: a new directory starts a run; an interrupted one (failed, preempted, killed)
  is resumed from its latest checkpoint; a completed one is refused (exit 2).
- ``always`` (bare ``--resume``): continue it even if it completed (e.g. with more steps).
- ``never``: refuse any existing run.
Every launch is recorded as an attempt in the manifest, and a lock file stops two launches
of the same experiment from writing into one directory at once. Nothing is overwritten.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

import primus
from primus.config.errors import ConfigError

RESOLVED_CONFIG = "config.resolved.yaml"
MANIFEST = "manifest.json"


def run_dir_of(spec) -> Path:
    return (Path(spec.workspace).expanduser() / spec.work_group / spec.user_name / spec.exp_name).absolute()


def _now() -> str:
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


RESUME_MODES = ("auto", "always", "never")
LOCK = ".primus.lock"


def make_run_dir(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"workspace: cannot write run directory {run_dir} ({exc.strerror})") from None


class RunDirLock:
    """An exclusive, non-blocking flock on the run directory for the life of the launch."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / LOCK
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


def decide_resume(run_dir: Path, mode: str) -> bool:
    """Apply the resume policy to an (already locked) run directory; True when resuming."""
    if mode not in RESUME_MODES:
        raise ConfigError(f"--resume {mode}: expected one of {', '.join(RESUME_MODES)}")
    previous = read_manifest(run_dir)
    if not previous:
        return False
    status, started = previous.get("status", "?"), previous.get("start_time", "?")
    if mode == "never" or (mode == "auto" and status == "completed"):
        hint = "pass --resume to continue it" if status == "completed" else "drop --resume never to resume it"
        raise ConfigError(f"{run_dir}: already holds a {status} run (started {started}); {hint}, "
                          "or set another exp_name")
    return True


def write_resolved_config(run_dir: Path, tree: dict[str, Any]) -> str:
    """Write the resolved (redacted) config once; return its sha256."""
    text = yaml.safe_dump(tree, sort_keys=False, default_flow_style=False)
    (run_dir / RESOLVED_CONFIG).write_text(text, encoding="utf-8")
    return hashlib.sha256(text.encode()).hexdigest()


def read_resolved_config(run_dir: Path) -> dict[str, Any]:
    return yaml.safe_load((run_dir / RESOLVED_CONFIG).read_text(encoding="utf-8"))


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


def read_manifest(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}


def write_manifest(run_dir: Path, manifest: dict[str, Any]) -> None:
    tmp = run_dir / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=False))
    tmp.replace(run_dir / MANIFEST)


def start_manifest(run_dir: Path, *, engine: str, engine_version: str | None, world_size: int,
                   config_hash: str, argv: list[str]) -> dict[str, Any]:
    manifest = read_manifest(run_dir)
    attempt = {"start_time": _now(), "command": argv, "world_size": world_size, "status": "running"}
    manifest.update({
        "primus": primus.__version__, "python": platform.python_version(), "torch": _version("torch"),
        "engine": engine, "engine_version": engine_version, "git_sha": _git_sha(), "host": socket.gethostname(),
        "command": argv, "world_size": world_size, "config_sha256": config_hash, "status": "running",
        "pid": os.getpid(), "executable": sys.executable,
    })
    manifest.setdefault("start_time", attempt["start_time"])
    manifest.setdefault("attempts", []).append(attempt)
    write_manifest(run_dir, manifest)
    return manifest


def record_restart(run_dir: Path, restart: int) -> None:
    """Called by rank 0 of a worker group that torchelastic restarted."""
    manifest = read_manifest(run_dir)
    if manifest.get("attempts"):
        manifest["attempts"][-1].setdefault("restarts", []).append({"restart": restart, "time": _now()})
        write_manifest(run_dir, manifest)


EXIT_STATUS = {0: "completed", 75: "preempted"}  # 75: primus.runtime.preemption.PREEMPTED_EXIT


def finish_manifest(run_dir: Path, manifest: dict[str, Any], exit_code: int, status: str | None = None) -> None:
    manifest = read_manifest(run_dir) or manifest  # workers may have recorded restarts meanwhile
    status = status or EXIT_STATUS.get(exit_code, "failed")
    end = _now()
    manifest.update({"end_time": end, "exit_code": exit_code, "status": status})
    manifest["attempts"][-1].update({"end_time": end, "exit_code": exit_code, "status": status})
    write_manifest(run_dir, manifest)
