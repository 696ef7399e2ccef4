"""The run directory ``{workspace}/{work_group}/{user_name}/{exp_name}/`` and its manifest.

Policy: a run directory belongs to one run. Launching an experiment whose directory already
holds a run is refused (exit 2) unless ``--resume`` is given, which continues that run from
its latest checkpoint and records a new attempt in the manifest. Nothing is overwritten.
"""
from __future__ import annotations

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


def claim_run_dir(run_dir: Path, *, resume: bool) -> bool:
    """Create (or, with ``resume``, reuse) the run directory; returns True when resuming."""
    manifest = run_dir / MANIFEST
    if manifest.exists():
        if not resume:
            previous = read_manifest(run_dir)
            raise ConfigError(
                f"{run_dir}: already holds a run (started {previous.get('start_time', '?')}, "
                f"status {previous.get('status', '?')}); pass --resume to continue it or set another exp_name"
            )
        return True
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"workspace: cannot write run directory {run_dir} ({exc.strerror})") from None
    return False


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


def finish_manifest(run_dir: Path, manifest: dict[str, Any], exit_code: int, status: str | None = None) -> None:
    status = status or ("completed" if exit_code == 0 else "failed")
    end = _now()
    manifest.update({"end_time": end, "exit_code": exit_code, "status": status})
    manifest["attempts"][-1].update({"end_time": end, "exit_code": exit_code, "status": status})
    write_manifest(run_dir, manifest)
