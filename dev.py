#!/usr/bin/env python3
"""Set up the pinned environment (idempotently) and run the demo or the test suite.

    python3 dev.py train     # tiny Llama-3 on CPU through TorchTitan (the default backend)
    python3 dev.py test      # the whole test suite (extra arguments go to pytest)

Standard library only: this is the bootstrap that exists before the venv does. The venv
lives at .venv/; installs are skipped when the pinned requirement files have not changed.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
REQ = ROOT / "requirements"
# Order matters: torch first so nothing later can pull a different (CUDA) build.
REQUIREMENT_FILES = ["torch-cpu.txt", "core.txt", "torchtitan.txt", "megatron.txt", "test.txt"]
# Installed through `primus prepare` (a no-deps engine wheel + pinned deps, torch frozen).
PREPARED_EXTRAS = ["automodel"]
STAMP = VENV / ".primus-setup"


def _fingerprint() -> str:
    digest = hashlib.sha256()
    for name in [*REQUIREMENT_FILES, *(f"{extra}.txt" for extra in PREPARED_EXTRAS), "constraints.txt"]:
        digest.update((REQ / name).read_bytes())
    digest.update((ROOT / "pyproject.toml").read_bytes())
    return digest.hexdigest()


def _pip(*args: str) -> None:
    subprocess.run([str(BIN / "python"), "-m", "pip", "--disable-pip-version-check", *args], check=True)


def ensure_venv() -> None:
    """Create .venv and install the pinned stack; a no-op when nothing changed."""
    if not (BIN / "python").exists():
        print(f"[setup] creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    fingerprint = _fingerprint()
    if STAMP.exists() and STAMP.read_text() == fingerprint:
        return
    print("[setup] installing pinned requirements (torch CPU build, engines, test tools)", flush=True)
    requirements = [arg for name in REQUIREMENT_FILES for arg in ("-r", str(REQ / name))]
    _pip("install", "-qq", "-c", str(REQ / "constraints.txt"), *requirements)
    _pip("install", "-qq", "--no-deps", "--no-build-isolation", "-e", str(ROOT))
    for extra in PREPARED_EXTRAS:
        subprocess.run([str(BIN / "python"), "-m", "primus.cli.main", "prepare", extra, "--quiet"], check=True)
    STAMP.write_text(fingerprint)
    print("[setup] done", flush=True)


# Debian packages some tests use (they skip with a reason where these cannot be installed).
TEST_SYSTEM_PACKAGES = {"pdftoppm": "poppler-utils"}


def ensure_test_system_packages() -> None:
    """Best effort, as root with apt: render-the-PDF checks need poppler's pdftoppm."""
    import shutil

    missing = [pkg for tool, pkg in TEST_SYSTEM_PACKAGES.items() if shutil.which(tool) is None]
    if not missing or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return
    print(f"[setup] apt-get install {' '.join(missing)}", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(["apt-get", "install", "-y", "-qq", *missing], env=env, capture_output=True).returncode:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], env=env, capture_output=True)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"train", "test", "setup"}:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    ensure_venv()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    command, rest = argv[0], argv[1:]
    if command == "setup":
        return 0
    if command == "train":
        # a fresh run directory per demo run: runs never overwrite each other
        env.setdefault("PRIMUS_EXP_NAME", time.strftime("llama3_tiny-pretrain-%Y%m%d-%H%M%S"))
        demo = ROOT / "examples" / "torchtitan" / "llama3_tiny-pretrain.yaml"
        return subprocess.call([str(BIN / "primus"), "train", str(demo), *rest], env=env, cwd=ROOT)
    ensure_test_system_packages()
    # Tests start many engine processes on few cores: libgomp's default spin-wait makes an idle
    # OpenMP worker burn the core another process needs (measured 70-150x slower steps under load;
    # docs/performance.md). Sleeping waiters cost little when a core is free.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if not any(arg == "-n" or arg.startswith(("-n", "--numprocesses")) for arg in rest) and (os.cpu_count() or 1) > 1:
        # two pytest workers, one test file each at a time (a file's fixtures stay in one process):
        # most tests wait on engine subprocesses, so two cores serve two files (31 -> 19 min on 2 cores);
        # files in the order tests/conftest.py puts them (xdist would queue the files with most tests first,
        # leaving a long one-test file to run alone at the end)
        rest = ["-n", "2", "--dist", "loadfile", "--no-loadscope-reorder", *rest]
    if not any(arg.startswith("--durations") for arg in rest):
        rest = ["--durations=20", *rest]  # the slowest tests, in every run's log (README lists them)
    return subprocess.call([str(BIN / "python"), "-m", "pytest", *rest], env=env, cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
