"""Install a backend's pinned stack without ever replacing the torch that is already there.

A GPU image ships its own ROCm or CUDA torch (and torchvision / torchaudio / triton built
against it). A plain ``pip install`` of an engine can resolve a different torch from PyPI and
silently swap the whole GPU stack. So every install runs with a pip constraint file that pins
those distributions to the versions installed right now.

Requirement files are ``requirements/<extra>.txt``. A line ending in ``# primus: no-deps`` is
installed in a second pip call with ``--no-deps`` (for wheels whose declared dependencies are
wrong for us, e.g. nemo-automodel drags a CUDA torch); the others' dependencies are pinned in
the same file. Nothing here imports pydantic or an engine (``primus --help`` lists the extras).
"""
from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REQUIREMENTS = Path(__file__).resolve().parents[2] / "requirements"
# Primus' own dependencies (requirements/core.txt), for an image that brings its own torch and got
# Primus with `pip install --no-deps -e .`: installable before any Primus import works.
CORE = "core"
FROZEN = ("torch", "torchvision", "torchaudio", "triton", "pytorch-triton-rocm")
NO_DEPS_MARK = "# primus: no-deps"
_PIN = re.compile(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s;#]+)")


@dataclass
class Plan:
    extra: str
    requirements: list[str]  # installed with their dependencies
    no_deps: list[str]  # installed with --no-deps
    frozen: list[str]  # the constraint file's lines: what is installed now

    @property
    def pins(self) -> dict[str, str]:
        return dict(m.groups() for line in self.requirements + self.no_deps if (m := _PIN.match(line)))


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def frozen_pins(names: tuple[str, ...] = FROZEN) -> list[str]:
    """``name==version`` for each of ``names`` that is installed (local labels like +rocm6.3 kept)."""
    return [f"{name}=={v}" for name in names if (v := installed_version(name))]


def extras() -> list[str]:
    """The installable extras: ``core``, and each backend adapter's own (``requirements/<extra>.txt``)."""
    from primus.runtime.registry import adapter_classes

    return sorted({adapter.extra for adapter in adapter_classes()} | {CORE})


_NOT_EXTRAS = ("constraints", "test", "torch-cpu")  # requirement files that are not installable extras


def plan(extra: str, requirements_dir: Path = REQUIREMENTS) -> Plan:
    # judged by the files, not by importing the adapters: in an image that got Primus with
    # `pip install --no-deps -e .`, Primus' own dependencies may not be there yet
    if extra in _NOT_EXTRAS or not (requirements_dir / f"{extra}.txt").is_file():
        known = sorted(p.stem for p in requirements_dir.glob("*.txt") if p.stem not in _NOT_EXTRAS)
        raise ValueError(f"unknown extra '{extra}'; known: {', '.join(known)}")
    lines = (requirements_dir / f"{extra}.txt").read_text().splitlines()
    with_deps, no_deps = [], []
    for raw in lines:
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        (no_deps if raw.rstrip().endswith(NO_DEPS_MARK) else with_deps).append(line)
    return Plan(extra, with_deps, no_deps, frozen_pins())


def missing(p: Plan) -> dict[str, str]:
    """Pinned distributions not installed at their pinned version (empty: nothing to do)."""
    out = {}
    for name, version in p.pins.items():
        have = installed_version(name)
        if have is None or have.split("+")[0] != version.split("+")[0]:
            out[_normalize(name)] = f"{have or 'absent'} -> {version}"
    return out


def pip_commands(p: Plan, constraint_file: Path, python: str = sys.executable, quiet: bool = False) -> list[list[str]]:
    base = [python, "-m", "pip", "install", "--disable-pip-version-check", *(["-qq"] if quiet else []),
            "-c", str(constraint_file)]
    commands = []
    if p.requirements:
        commands.append([*base, *p.requirements])
    if p.no_deps:
        commands.append([*base, "--no-deps", *p.no_deps])
    return commands


def prepare(extra: str, *, dry_run: bool = False, force: bool = False, quiet: bool = False, with_te: bool = False,
            out=print) -> int:
    """Install ``extra``'s pinned stack under a constraint freezing the installed torch family; with
    ``with_te`` (the megatron extra), Transformer Engine for the installed torch too (``te.py``)."""
    p = plan(extra)
    te = None
    if with_te:
        te = _te_install(extra)
        if isinstance(te, str):
            print(f"primus: error: prepare {extra} --with-te: {te}", file=sys.stderr)
            return 2
    todo = missing(p)
    te_todo = te is not None and (force or not te.done())
    if not todo and not te_todo and not force:
        out(f"primus prepare {extra}: already installed at the pinned versions, nothing to do")
        return 0
    with tempfile.TemporaryDirectory(prefix="primus-prepare-") as tmp:
        constraint = Path(tmp) / "constraints.txt"
        constraint.write_text("".join(f"{line}\n" for line in p.frozen))
        commands = [(command, {}) for command in pip_commands(p, constraint, quiet=quiet)] if todo or force else []
        if te_todo:
            commands.append((te.command(sys.executable, str(constraint), quiet=quiet), te.env))
        if dry_run:
            pending = [f"{k} ({v})" for k, v in sorted(todo.items())]
            if te_todo:
                pending.append(f"Transformer Engine ({te.build} build: {te.requirement})")
            out(f"# to install: {', '.join(pending) or 'nothing (forced)'}")
            out(f"# constraint file {constraint} (keeps the installed torch family):")
            for line in p.frozen or ["(no torch installed: nothing to freeze)"]:
                out(f"#   {line}")
            for command, env in commands:
                out(_shell_line(command, env))
            return 0
        for command, env in commands:
            out("+ " + _shell_line(command, env))
            rc = subprocess.call(command, env={**os.environ, **env} if env else None)
            if rc:
                return rc
    changed = [line for line in p.frozen if line not in frozen_pins()]
    if changed:  # cannot happen under the constraint; a loud check costs nothing
        out(f"primus prepare {extra}: WARNING the torch family changed: {changed}")
        return 1
    out(f"primus prepare {extra}: done")
    return 0


def _shell_line(command: list[str], env: dict[str, str]) -> str:
    """A command as printed: its build environment in front, quoted where the shell needs it."""
    if not env:
        return " ".join(command)
    import shlex

    return shlex.join([f"{key}={value}" for key, value in env.items()] + command)


def _te_install(extra: str):
    """The Transformer Engine install for this torch, or the one-line reason there is none."""
    from primus.prepare.te import NoTransformerEngine, installed_torch, te_install

    if extra != "megatron":
        return "Transformer Engine is the Megatron backend's (primus prepare megatron --with-te)"
    torch = installed_torch()
    if torch is None:
        return "no torch is installed (Transformer Engine is built against the image's CUDA or ROCm torch)"
    try:
        return te_install(*torch)
    except NoTransformerEngine as exc:
        return str(exc)
