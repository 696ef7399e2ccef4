"""The tiny experiment trains inside real containers: podman (rootful, offline, the host root
as an overlay rootfs) and docker (a private dockerd, a locally imported minimal image with
/usr bind-mounted). Logs land in the mounted workspace."""
import json
import os
import subprocess

import pytest

from tests.conftest import PRIMUS, ROOT, TINY_EXAMPLE, write
from tests.helpers import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]
pytest.importorskip("torchtitan")


def _train_in_container(tmp_path, tiny_cache, engine_env, launcher_yaml, exp, *args):
    launcher = write(tmp_path / "launcher.yaml", launcher_yaml)
    env = {**os.environ, **engine_env, "PRIMUS_WORKSPACE": str(tmp_path / "ws"), "PRIMUS_CACHE": str(tiny_cache),
           "PRIMUS_USER_CONFIG": "/nonexistent", "PYTHONUNBUFFERED": "1", "HF_TOKEN": "hf_must_stay_outside"}
    out = subprocess.run(["timeout", "-k", "10", "300", *PRIMUS, "train", str(TINY_EXAMPLE), f"exp_name={exp}",
                          "training.steps=2", "--launcher-config", str(launcher), *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=330)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run_dir = tmp_path / "ws" / "amd" / "root" / exp
    assert len(read_metrics(run_dir)) == 2
    assert (run_dir / "logs" / "pre_trainer" / "rank-0" / "info.log").stat().st_size > 0
    assert "not passing secret variables" not in out.stderr  # HF_TOKEN goes in, by name
    leaked = [p for p in run_dir.rglob("*") if p.is_file() and b"hf_must_stay_outside" in p.read_bytes()]
    assert not leaked and "hf_must_stay_outside" not in out.stdout + out.stderr
    return out, json.loads((run_dir / "manifest.json").read_text())


def test_podman_runs_the_tiny_experiment(podman_env, tmp_path, tiny_cache):
    out, manifest = _train_in_container(
        tmp_path, tiny_cache, podman_env,
        "launcher:\n  container:\n    engine: podman\n    image: '/:O'\n    run_args: ['--rootfs']\n", "podman1",
        "--executor", "container")
    assert "running in podman" in out.stdout and manifest["status"] == "completed"


def test_docker_runs_the_tiny_experiment(docker_env, tmp_path, tiny_cache):
    out, manifest = _train_in_container(
        tmp_path, tiny_cache, docker_env,
        "launcher:\n  container:\n    engine: docker\n    mounts: ['/usr:/usr:ro']\n", "docker1",
        "--container", "localhost/primus-host:latest")
    assert "running in docker" in out.stdout and manifest["status"] == "completed"


def test_podman_runs_it_with_the_images_own_python(podman_env, tmp_path, tiny_cache):
    """The blog's flow: the image's interpreter and torch run Primus, installed into it at start with
    pip install --no-deps -e. Here the "image" is this host's root as an overlay (nothing leaks back) and
    its own Python is a fresh venv whose packages (torch, engines) are not Primus'."""
    import sys

    image_python = tmp_path / "imagepy"
    # no pip of its own (ensurepip costs seconds): the image's stack below brings one, as an image's would
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(image_python)], check=True, timeout=120)
    site = next((image_python / "lib").glob("python3*/site-packages"))
    host_site = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    (site / "image_stack.pth").write_text(host_site + "\n")  # torch & co, not the host's Primus install
    probe = [str(image_python / "bin" / "python"), "-c", "import torch; print(torch.__version__); import primus"]
    before = subprocess.run(probe, capture_output=True, text=True, timeout=120, cwd=tmp_path)  # not the repo
    assert "No module named 'primus'" in before.stderr, before.stderr  # the image has torch, not Primus
    out, manifest = _train_in_container(
        tmp_path, tiny_cache, podman_env,
        "launcher:\n  container:\n    engine: podman\n    image: '/:O'\n    run_args: ['--rootfs']\n"
        f"    python: {image_python / 'bin' / 'python'}\n", "podman_image_python", "--executor", "container")
    assert manifest["status"] == "completed" and manifest["torch"] == before.stdout.split()[0]
    after = subprocess.run(probe, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert "No module named 'primus'" in after.stderr  # installed in the container's overlay only
