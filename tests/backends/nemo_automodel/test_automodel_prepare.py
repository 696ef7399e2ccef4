"""`primus prepare`: the constraint file keeps the installed torch, checked with pip's own resolver.

Offline: fake wheels in a local folder stand in for PyPI (`--no-index --find-links`).
"""
from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from primus.prepare.pip import frozen_pins, pip_commands, plan, prepare

TORCH = frozen_pins(("torch",))[0]  # e.g. torch==2.13.0+cpu
TORCH_VERSION = TORCH.split("==")[1]


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> None:
    dist = f"{name.replace('-', '_')}-{version}"
    files = {
        f"{dist}.dist-info/METADATA": "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
            name, version, "".join(f"Requires-Dist: {r}\n" for r in requires)),
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(t.encode())}" for p, t in files.items()]
    files[f"{dist}.dist-info/RECORD"] = "\n".join(record + [f"{dist}.dist-info/RECORD,,"]) + "\n"
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)


def _dry_run(index: Path, requirement: str, constraint: Path | None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-", "--no-index",
           "--find-links", str(index), "--disable-pip-version-check", requirement]
    if constraint is not None:
        cmd += ["-c", str(constraint)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _installs(proc: subprocess.CompletedProcess) -> dict[str, str]:
    report = json.loads(proc.stdout)
    return {i["metadata"]["name"]: i["metadata"]["version"] for i in report["install"]}


@pytest.fixture
def index(tmp_path):
    folder = tmp_path / "index"
    folder.mkdir()
    _wheel(folder, "torch", "2.11.0", [])  # the "other" torch an engine could drag in
    _wheel(folder, "wants-old-torch", "1.0", ["torch==2.11.0"])
    _wheel(folder, "wants-any-torch", "1.0", ["torch>=2.0"])
    return folder


@pytest.mark.e2e
def test_constraint_keeps_the_installed_torch(index, tmp_path):
    constraint = tmp_path / "constraints.txt"
    constraint.write_text("\n".join(frozen_pins()) + "\n")
    unconstrained = _dry_run(index, "wants-old-torch", None)
    assert unconstrained.returncode == 0, unconstrained.stderr
    assert _installs(unconstrained).get("torch") == "2.11.0"  # without the constraint: torch is replaced
    constrained = _dry_run(index, "wants-old-torch", constraint)
    assert constrained.returncode != 0 and "conflict" in constrained.stderr.lower()  # with it: refused
    compatible = _dry_run(index, "wants-any-torch", constraint)
    assert compatible.returncode == 0, compatible.stderr
    assert "torch" not in _installs(compatible)  # the installed torch satisfies it, nothing changes


def test_plan_splits_no_deps_and_freezes_torch():
    p = plan("automodel")
    assert p.no_deps == ["nemo-automodel==0.7.0"]
    assert not any(line.startswith("torch==") for line in p.requirements)
    assert TORCH in p.frozen
    commands = pip_commands(p, Path("/tmp/c.txt"))
    assert all(["-c", "/tmp/c.txt"] == cmd[cmd.index("-c"):cmd.index("-c") + 2] for cmd in commands)
    assert "--no-deps" in commands[-1]
    for extra in ("torchtitan", "megatron"):
        assert plan(extra).requirements


def test_prepare_is_idempotent_and_dry_run_prints_the_plan():
    lines: list[str] = []
    assert prepare("automodel", out=lines.append) == 0
    assert "nothing to do" in lines[-1]
    lines.clear()
    assert prepare("automodel", dry_run=True, force=True, out=lines.append) == 0
    text = "\n".join(lines)
    assert f"#   {TORCH}" in text and "--no-deps nemo-automodel==0.7.0" in text
