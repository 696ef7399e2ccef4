"""README "On a ROCm/CUDA image": `primus prepare <backend>` installs an engine into an image and
never replaces the image's torch, for real: a fresh venv plays the image (its torch a ROCm build),
a local folder plays PyPI (PIP_NO_INDEX/PIP_FIND_LINKS), pip installs for real."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.backends.nemo_automodel.test_automodel_prepare import _wheel
from tests.conftest import ROOT

pytestmark = [pytest.mark.timeout(300)]
IMAGE_TORCH = "2.9.1+rocm6.3"  # a ROCm build from an image, not the version the engines pin


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    """A Python with a ROCm torch and Primus' source reachable (as `pip install --no-deps -e .` leaves it)."""
    root = tmp_path_factory.mktemp("image")
    index = root / "index"
    index.mkdir()
    _wheel(index, "torch", IMAGE_TORCH, [])
    venv = root / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True, timeout=180)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-qq", "--no-index", "--find-links", str(index),
                    f"torch=={IMAGE_TORCH}"], check=True, timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "primus_source.pth").write_text(str(ROOT) + "\n")
    return python, index


def _prepare(python: Path, index: Path, engine_requires: list[str]) -> subprocess.CompletedProcess:
    for old in index.glob("torchtitan-*"):
        old.unlink()
    for line in (ROOT / "requirements" / "torchtitan.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):  # the extra's other pins: empty stand-ins
            name, version = line.split("==")
            _wheel(index, name, version, engine_requires if name == "torchtitan" else [])
    _wheel(index, "torch", "2.11.0", [])  # what an engine's own pin would drag in from the index
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index)}
    return subprocess.run([str(python), "-m", "primus.prepare", "torchtitan", "--quiet"], env=env, capture_output=True,
                          text=True, timeout=240)


def _version(python: Path, name: str) -> str:
    return subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version('{name}'))"],
                          capture_output=True, text=True, timeout=60).stdout.strip()


@pytest.mark.e2e
def test_an_engine_that_wants_another_torch_is_refused_and_torch_stays(image):
    python, index = image
    out = _prepare(python, index, ["torch==2.11.0"])
    assert out.returncode != 0 and "conflict" in (out.stdout + out.stderr).lower(), out.stdout + out.stderr
    assert _version(python, "torch") == IMAGE_TORCH


@pytest.mark.e2e
def test_an_engine_that_accepts_the_images_torch_installs_beside_it(image):
    python, index = image
    out = _prepare(python, index, ["torch>=2"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert _version(python, "torchtitan") == "0.3.0" and _version(python, "torch") == IMAGE_TORCH
    again = _prepare(python, index, ["torch>=2"])
    assert again.returncode == 0 and "nothing to do" in again.stdout  # idempotent


@pytest.mark.e2e
def test_core_prepares_before_primus_own_dependencies_exist(image):
    """In the image right after `pip install --no-deps -e .`: no pydantic, no PyYAML, yet
    `python -m primus.prepare core` plans their install under the frozen torch."""
    python, _ = image
    assert subprocess.run([str(python), "-c", "import yaml"], capture_output=True, timeout=60).returncode != 0
    out = subprocess.run([str(python), "-m", "primus.prepare", "core", "--dry-run"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"#   torch=={IMAGE_TORCH}" in out.stdout and "pydantic==" in out.stdout and "PyYAML==" in out.stdout
