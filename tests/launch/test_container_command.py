"""Container command lines, exactly: devices, mounts, environment, secrets (docker, podman, apptainer)."""

import pytest

from primus.config.errors import ConfigError
from primus.launch.config import ContainerSection
from primus.launch.container import REPO_ROOT, build_container_command

INNER = ["python3", "-m", "primus.cli.main", "train", "/exp.yaml", "--executor", "local"]
ENV = {"NCCL_DEBUG": "INFO", "RCCL_MSCCL_ENABLE": "0", "GLOO_SOCKET_IFNAME": "eth0", "HF_HOME": "/nonexistent-hf",
       "HF_TOKEN": "hf_secret_value", "WANDB_API_KEY": "k", "PRIMUS_TEAM": "amd", "MASTER_ADDR": "n1",
       "NNODES": "2", "NODE_RANK": "1", "GPUS_PER_NODE": "8", "AWS_SECRET": "s", "DB_PASSWORD": "p",
       "HOME": "/home/u", "PATH": "/usr/bin"}


def _dev(tmp_path, *names):
    dev = tmp_path / "dev"
    for name in names:
        (dev / name).mkdir(parents=True, exist_ok=True)
    dev.mkdir(exist_ok=True)
    return dev


def _build(tmp_path, engine, dev, **section):
    section = ContainerSection(**{"image": "rocm/primus:v1", "engine": engine, "python": "python3", "install": False,
                                  **section})
    return build_container_command(section, INNER, explicit_env={}, workspace=tmp_path / "ws", env=dict(ENV),
                                   cwd=tmp_path, dev=dev, which=lambda name: f"/usr/bin/{name}")


@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_rocm_devices_mounts_and_env(tmp_path, engine):
    cmd = _build(tmp_path, engine, _dev(tmp_path, "kfd", "dri"), mounts=["/data:/data:ro"])
    dev = tmp_path / "dev"
    assert cmd.argv == [
        engine, "run", "--rm", "--network", "host", "--ipc", "host",
        "--device", f"{dev}/kfd", "--device", f"{dev}/dri",
        "--group-add", "video", "--cap-add", "SYS_PTRACE", "--security-opt", "seccomp=unconfined",
        "-v", f"{REPO_ROOT}:{REPO_ROOT}", "-v", f"{tmp_path}:{tmp_path}", "-v", "/data:/data:ro",
        "-e", "GLOO_SOCKET_IFNAME=eth0", "-e", "GPUS_PER_NODE=8", "-e", "HF_HOME=/nonexistent-hf",
        "-e", "HF_TOKEN", "-e", "MASTER_ADDR=n1", "-e", "NCCL_DEBUG=INFO", "-e", "NNODES=2", "-e", "NODE_RANK=1",
        "-e", "PRIMUS_TEAM=amd", "-e", "RCCL_MSCCL_ENABLE=0", "-e", "WANDB_API_KEY", "-e", f"PYTHONPATH={REPO_ROOT}",
        "-w", str(tmp_path), "rocm/primus:v1", *INNER]
    assert f"skipping {dev}/infiniband: not present on this host" in cmd.notices
    argv = " ".join(cmd.argv)
    assert "hf_secret_value" not in argv and "AWS_SECRET" not in argv and "DB_PASSWORD" not in argv


def test_rocm_tuning_variables_are_forwarded_and_the_list_is_configurable(tmp_path):
    tuning = {"USE_HIPBLASLT": "1", "TORCH_BLAS_PREFER_HIPBLASLT": "1", "HIP_FORCE_DEV_KERNARG": "1",
              "GPU_MAX_HW_QUEUES": "2", "HSA_NO_SCRATCH_RECLAIM": "1", "NCCL_IB_HCA": "mlx5", "RCCL_MSCCLPP_ENABLE": "1",
              "MY_TUNING": "7", "GH_TOKEN": "gh_secret", "HF_HUB_TOKEN": "x_secret"}
    section = ContainerSection(image="i", engine="docker", install=False)
    cmd = build_container_command(section, INNER, explicit_env={}, workspace=None, env={**ENV, **tuning},
                                  cwd=tmp_path, dev=_dev(tmp_path), which=lambda n: n)
    for name, value in tuning.items():
        if name not in ("MY_TUNING", "GH_TOKEN", "HF_HUB_TOKEN"):
            assert f"{name}={value}" in cmd.argv
    assert "MY_TUNING=7" not in cmd.argv and "gh_secret" not in " ".join(cmd.argv)
    assert "not passing secret variables HF_HUB_TOKEN (use --container-env-secrets)" in cmd.notices
    mine = ContainerSection(image="i", engine="docker", install=False, forward_env=["MY_*"], pass_secrets=["GH_TOKEN"])
    cmd = build_container_command(mine, INNER, explicit_env={}, workspace=None, env={**ENV, **tuning},
                                  cwd=tmp_path, dev=_dev(tmp_path), which=lambda n: n)
    assert "MY_TUNING=7" in cmd.argv and "NCCL_DEBUG=INFO" not in cmd.argv  # the launcher file's list replaces it
    assert ["-e", "GH_TOKEN"] == cmd.argv[cmd.argv.index("GH_TOKEN") - 1: cmd.argv.index("GH_TOKEN") + 1]


def test_the_images_python_installs_primus_at_start_without_touching_torch(tmp_path):
    cmd = _build(tmp_path, "docker", _dev(tmp_path), install=True)
    assert cmd.argv[-3:-1] == ["sh", "-c"]
    script = cmd.argv[-1]
    pip = "python3 -m pip install -qq --disable-pip-version-check --no-deps"
    assert script == (f"{{ {pip} --no-build-isolation -e {REPO_ROOT} 2>/dev/null || {pip} -e {REPO_ROOT}; }} && "
                      f"python3 -m primus.prepare core --quiet && exec {' '.join(INNER)}")
    host_python = build_container_command(ContainerSection(image="i", engine="docker"), INNER, explicit_env={},
                                          workspace=None, env={}, cwd=tmp_path, dev=_dev(tmp_path),
                                          which=lambda n: n)
    assert host_python.argv[-len(INNER):] == INNER  # this host's venv, mounted: nothing to install


def test_secrets_only_by_name_when_allowed(tmp_path):
    cmd = _build(tmp_path, "docker", _dev(tmp_path), env_secrets=True, ipc="private", shm_size="32g")
    assert ["-e", "HF_TOKEN"] == cmd.argv[cmd.argv.index("HF_TOKEN") - 1: cmd.argv.index("HF_TOKEN") + 1]
    assert "hf_secret_value" not in cmd.describe()
    assert cmd.argv[5:9] == ["--ipc", "private", "--shm-size", "32g"]
    assert "no GPU devices found (no /dev/kfd, /dev/nvidia*): the container runs on CPU" in cmd.notices


def test_nvidia(tmp_path):
    dev = _dev(tmp_path, "nvidia0", "infiniband")
    assert _build(tmp_path, "docker", dev).argv[5:11] == ["--ipc", "host", "--gpus", "all", "--device",
                                                          f"{dev}/infiniband"]
    assert _build(tmp_path, "podman", dev).argv[7:9] == ["--device", "nvidia.com/gpu=all"]
    assert "--nv" in _build(tmp_path, "apptainer", dev).argv


def test_apptainer(tmp_path):
    cmd = _build(tmp_path, "apptainer", _dev(tmp_path, "kfd", "dri"), env_secrets=True)
    assert cmd.argv == [
        "apptainer", "exec", "--cleanenv", "--rocm",
        "--bind", f"{REPO_ROOT}:{REPO_ROOT}", "--bind", f"{tmp_path}:{tmp_path}", "--pwd", str(tmp_path),
        "--env", "GLOO_SOCKET_IFNAME=eth0", "--env", "GPUS_PER_NODE=8", "--env", "HF_HOME=/nonexistent-hf",
        "--env", "MASTER_ADDR=n1", "--env", "NCCL_DEBUG=INFO", "--env", "NNODES=2", "--env", "NODE_RANK=1",
        "--env", "PRIMUS_TEAM=amd", "--env", "RCCL_MSCCL_ENABLE=0", "--env", f"PYTHONPATH={REPO_ROOT}",
        "rocm/primus:v1", *INNER]
    assert cmd.env == {"APPTAINERENV_HF_TOKEN": "hf_secret_value", "APPTAINERENV_WANDB_API_KEY": "k"}  # not in argv
    assert cmd.describe().startswith("env 'APPTAINERENV_HF_TOKEN=<redacted>' 'APPTAINERENV_WANDB_API_KEY=<redacted>' "
                                     "apptainer exec")


def test_engine_choice(tmp_path):
    section = ContainerSection(image="x", engine="auto")
    pick = lambda *names: (lambda name: f"/bin/{name}" if name in names else None)  # noqa: E731
    kw = dict(explicit_env={}, workspace=None, env={}, cwd=tmp_path, dev=_dev(tmp_path))
    assert build_container_command(section, INNER, which=pick("docker"), **kw).engine == "docker"
    assert build_container_command(section, INNER, which=pick("docker", "podman"), **kw).engine == "podman"
    assert build_container_command(section, INNER, which=pick("singularity"), **kw).engine == "apptainer"
    with pytest.raises(ConfigError, match="no container engine found"):
        build_container_command(section, INNER, which=pick(), **kw)
    with pytest.raises(ConfigError, match="'docker' is not installed"):
        build_container_command(ContainerSection(image="x", engine="docker"), INNER, which=pick(), **kw)
