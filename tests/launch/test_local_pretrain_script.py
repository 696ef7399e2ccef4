"""The blog's flow, as typed: `DOCKER_IMAGE=… HF_TOKEN=… EXP=… bash examples/run_local_pretrain.sh --dry-run`."""
from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import ROOT, TINY_EXAMPLE

pytestmark = pytest.mark.e2e  # every test here starts Primus or an engine in another process

SECRET = "hf_blogflow_secret_123"


def _script(tmp_path, *args, **env):
    full = {k: v for k, v in os.environ.items() if k not in ("IMAGE", "DOCKER_IMAGE")}
    full.update({"EXP": str(TINY_EXAMPLE), "PRIMUS_WORKSPACE": str(tmp_path / "ws"), "PRIMUS_CACHE": str(tmp_path),
                 "PRIMUS_USER_CONFIG": "/nonexistent", **env})
    return subprocess.run(["bash", "examples/run_local_pretrain.sh", "--container-engine", "docker", *args], cwd=ROOT,
                          env=full, capture_output=True, text=True, timeout=120)


def test_docker_image_hf_token_by_name_and_rocm_tuning(tmp_path):
    out = _script(tmp_path, "--dry-run", "training.steps=3", DOCKER_IMAGE="rocm/primus:v25.9", IMAGE="other:1",
                  HF_TOKEN=SECRET, USE_HIPBLASLT="1", TORCH_BLAS_PREFER_HIPBLASLT="1", HIP_FORCE_DEV_KERNARG="1",
                  GPU_MAX_HW_QUEUES="2")
    assert out.returncode == 0, out.stderr
    command = next(line for line in out.stdout.splitlines() if line.startswith("command:"))
    assert " rocm/primus:v25.9 sh -c " in command and "other:1" not in command  # DOCKER_IMAGE wins over IMAGE
    assert " -e HF_TOKEN " in command and SECRET not in out.stdout + out.stderr  # by name, never the value
    for name, value in (("USE_HIPBLASLT", "1"), ("TORCH_BLAS_PREFER_HIPBLASLT", "1"), ("HIP_FORCE_DEV_KERNARG", "1"),
                        ("GPU_MAX_HW_QUEUES", "2")):
        assert f" -e {name}={value} " in command
    assert "python3 -m pip install -qq --disable-pip-version-check --no-deps --no-build-isolation -e" in command
    assert "python3 -m primus.prepare core --quiet" in command  # Primus' own deps, the image's torch frozen
    assert "exec python3 -m primus.cli.main train" in command and "training.steps=3" in command  # flags pass through


def test_image_is_enough_and_one_is_required(tmp_path):
    out = _script(tmp_path, "--dry-run", IMAGE="localhost/cpu:1", CONTAINER_PYTHON="")
    assert out.returncode == 0, out.stderr
    command = next(line for line in out.stdout.splitlines() if line.startswith("command:"))
    assert " localhost/cpu:1 " in command and "sh -c" not in command  # CONTAINER_PYTHON= : this host's venv
    missing = _script(tmp_path, "--dry-run")
    assert missing.returncode != 0 and "set DOCKER_IMAGE (or IMAGE)" in missing.stderr
