"""Run a node's ``primus train`` inside a container: docker, podman or apptainer.

What goes in: GPU devices (ROCm ``/dev/kfd``, ``/dev/dri``, ``/dev/infiniband``; NVIDIA
``--gpus all``), host network and IPC, the repo/workspace/cache/HF-cache mounts, and the host
variables matching ``launcher.container.forward_env`` (Primus', rendezvous, NCCL/RCCL/GLOO and
ROCm/HIP/HSA tuning such as ``USE_HIPBLASLT``, ``TORCH_BLAS_PREFER_HIPBLASLT``,
``HIP_FORCE_DEV_KERNARG``, ``GPU_MAX_HW_QUEUES``). Secrets (``*_TOKEN``, ``*_KEY``, ``*_SECRET``,
``*PASSWORD*``) go in only by name: those in ``pass_secrets`` (``HF_TOKEN``, ``WANDB_API_KEY``)
always, the others with ``env_secrets``; docker/podman get ``-e NAME`` and read the value from
their own environment, apptainer gets ``APPTAINERENV_NAME``, so no value is ever on a command line.

Which Python: by default this interpreter, its venv mounted. With ``python`` (e.g. ``python3``,
``--container-python``) the image's own interpreter and torch run it: at container start Primus
is installed into it with ``pip install --no-deps -e REPO`` and its few own dependencies under a
constraint that freezes the image's torch (``python -m primus.prepare core``), as AMD Primus'
prepare step does; the image's ROCm/CUDA torch is never replaced. A device that is absent on this
host is skipped with a notice (an engine refuses ``--device`` for a missing path).
"""
from __future__ import annotations

import fnmatch
import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from primus.config.errors import ConfigError
from primus.config.secrets import REDACTED, is_secret_env
from primus.launch.config import ContainerSection

ENGINES = ("podman", "docker", "apptainer")
ROCM_DEVICES = ("kfd", "dri", "infiniband")
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ContainerCommand:
    engine: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to the engine's environment
    notices: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """The command as it would be typed, secret values masked."""
        prefix = [f"{k}={REDACTED if is_secret_env(k.removeprefix('APPTAINERENV_')) else v}"
                  for k, v in sorted(self.env.items())]
        return shlex.join(prefix + self.argv) if not prefix else "env " + shlex.join(prefix + self.argv)


def pick_engine(preferred: str, which=shutil.which, *, dry_run: bool = False) -> str:
    if preferred != "auto":
        if not dry_run and not which(preferred) and not (preferred == "apptainer" and which("singularity")):
            raise ConfigError(f"launcher.container.engine={preferred}: '{preferred}' is not installed on this host")
        return preferred
    for name in ENGINES:
        if which(name):
            return name
    if which("singularity"):
        return "apptainer"
    raise ConfigError("--container: no container engine found (install podman, docker or apptainer, "
                      "or set launcher.container.engine)")


def gpu_kind(preferred: str, dev: Path) -> str:
    if preferred != "auto":
        return preferred
    if (dev / "kfd").exists():
        return "rocm"
    if (dev / "nvidia0").exists() or (dev / "nvidiactl").exists():
        return "nvidia"
    return "none"


def _device_flags(engine: str, kind: str, dev: Path) -> tuple[list[str], list[str]]:
    flags: list[str] = []
    notices: list[str] = []
    if kind == "none":
        return flags, ["no GPU devices found (no /dev/kfd, /dev/nvidia*): the container runs on CPU"]
    if kind == "rocm":
        present = [name for name in ROCM_DEVICES if (dev / name).exists()]
        notices += [f"skipping {dev / name}: not present on this host" for name in ROCM_DEVICES if name not in present]
        if engine == "apptainer":
            if "kfd" in present:
                flags.append("--rocm")
            if "infiniband" in present:
                flags += ["--bind", f"{dev / 'infiniband'}"]
        else:
            for name in present:
                flags += ["--device", str(dev / name)]
            if present:
                flags += ["--group-add", "video", "--cap-add", "SYS_PTRACE", "--security-opt", "seccomp=unconfined"]
        return flags, notices
    # nvidia
    if engine == "apptainer":
        flags.append("--nv")
    elif engine == "podman":
        flags += ["--device", "nvidia.com/gpu=all"]  # CDI: podman has no --gpus
    else:
        flags += ["--gpus", "all"]
    if (dev / "infiniband").exists():
        flags += ["--bind", str(dev / "infiniband")] if engine == "apptainer" else ["--device", str(dev / "infiniband")]
    else:
        notices.append(f"skipping {dev / 'infiniband'}: not present on this host")
    return flags, notices


def forwarded_env(env: dict[str, str], explicit: dict[str, str], section: ContainerSection) -> tuple[dict[str, str], list[str]]:
    """Variables to pass in (name -> value) and the secret names left out."""
    chosen: dict[str, str] = {}
    skipped: list[str] = []
    from primus.logs.held import SET_HERE  # Primus' own quieting switches: the container's Primus sets its own

    extra_names = {item.split("=", 1)[0]: item for item in section.env}
    for name in sorted(env):
        if name in SET_HERE and name not in extra_names:
            continue
        if name in extra_names or any(fnmatch.fnmatchcase(name, pattern) for pattern in section.forward_env):
            if is_secret_env(name) and not section.env_secrets and name not in extra_names \
                    and name not in section.pass_secrets:
                skipped.append(name)
                continue
            chosen[name] = env[name]
        elif name in section.pass_secrets:
            chosen[name] = env[name]
    for name, item in extra_names.items():
        if "=" in item:
            chosen[name] = item.split("=", 1)[1]
    chosen.update(explicit)
    return chosen, skipped


def install_then(section: ContainerSection, inner: list[str]) -> list[str]:
    """The image's interpreter: install Primus into it at container start, then run ``inner``."""
    if not section.python or not section.install:
        return inner
    py, repo = shlex.quote(section.python), shlex.quote(str(REPO_ROOT))
    pip = f"{py} -m pip install -qq --disable-pip-version-check --no-deps"
    # the image's own setuptools first (offline); without `wheel` in an old setuptools, pip's isolated build
    install = f"{{ {pip} --no-build-isolation -e {repo} 2>/dev/null || {pip} -e {repo}; }}"
    steps = [install, f"{py} -m primus.prepare core --quiet", f"exec {shlex.join(inner)}"]
    return ["sh", "-c", " && ".join(steps)]


def mounts_for(workspace: Path | None, section: ContainerSection, env: dict[str, str], cwd: Path) -> list[tuple[str, str, str]]:
    """(source, target, options) bind mounts; nested or repeated paths are mounted once."""
    wanted: list[tuple[str, str, str]] = []
    candidates = [REPO_ROOT, cwd]
    if section.python is None:  # run this interpreter inside: its venv and base install must be there
        candidates += [Path(sys.prefix), Path(sys.base_prefix)]
    created = [workspace] if workspace is not None else []  # made by the run: mounted even before they exist
    if env.get("PRIMUS_CACHE"):
        created.append(Path(env["PRIMUS_CACHE"]).expanduser())
    hf_home = Path(env["HF_HOME"]).expanduser() if env.get("HF_HOME") else Path("~/.cache/huggingface").expanduser()
    if hf_home.exists():
        candidates.append(hf_home)
    for path in [*candidates, *created]:
        path = path.absolute()
        if str(path) in ("/", "/usr", "/usr/local") or not (path.exists() or path in created):
            continue
        wanted.append((str(path), str(path), ""))
    for spec in section.mounts:
        parts = spec.split(":")
        if len(parts) > 3 or not parts[0]:
            raise ConfigError(f"launcher.container.mounts: '{spec}' is not SRC[:DST[:OPTS]]")
        source = str(Path(parts[0]).expanduser().absolute())
        wanted.append((source, parts[1] if len(parts) > 1 and parts[1] else source, parts[2] if len(parts) > 2 else ""))
    kept: list[tuple[str, str, str]] = []
    for source, target, opts in wanted:
        inside = [s for s, t, o in kept if s == t and not o and (source == s or source.startswith(s + "/"))]
        if not (inside and source == target and not opts):
            kept.append((source, target, opts))
    return kept


def build_container_command(section: ContainerSection, inner: list[str], *, explicit_env: dict[str, str],
                            workspace: Path | None, env: dict[str, str] | None = None, cwd: Path | None = None,
                            dev: Path = Path("/dev"), which=shutil.which, name: str | None = None,
                            dry_run: bool = False) -> ContainerCommand:
    if not section.image:
        raise ConfigError("--container: no image given (--container IMAGE or launcher.container.image)")
    env = dict(os.environ if env is None else env)
    cwd = cwd or Path.cwd()
    engine = pick_engine(section.engine, which, dry_run=dry_run)
    kind = gpu_kind(section.gpus, dev)
    devices, notices = _device_flags(engine, kind, dev)
    passed, skipped = forwarded_env(env, explicit_env, section)
    inner = install_then(section, inner)
    passed.setdefault("PYTHONPATH", str(REPO_ROOT))
    if skipped:
        notices.append(f"not passing secret variables {', '.join(skipped)} (use --container-env-secrets)")
    mounts = mounts_for(workspace, section, env, cwd)
    if engine == "apptainer":
        argv = ["apptainer", "exec", "--cleanenv", *devices]
        for source, target, opts in mounts:
            argv += ["--bind", ":".join(p for p in (source, target, opts) if p)]
        argv += ["--pwd", str(cwd)]
        child_env = {}
        for key, value in passed.items():
            if is_secret_env(key):
                child_env[f"APPTAINERENV_{key}"] = value
            else:
                argv += ["--env", f"{key}={value}"]
        argv += [*section.run_args, section.image, *inner]
        if section.ipc != "host" or section.shm_size:
            notices.append("apptainer always shares the host's network, IPC and /dev/shm: ipc/shm_size ignored")
        return ContainerCommand(engine, argv, child_env, notices)

    argv = [engine, "run", "--rm", "--network", "host"]
    if name:
        argv += ["--name", name]
    if section.ipc == "host":
        argv += ["--ipc", "host"]
        if section.shm_size:
            notices.append(f"shm_size={section.shm_size} ignored: --ipc host shares the host's /dev/shm")
    else:
        argv += ["--ipc", "private", "--shm-size", section.shm_size or "16g"]
    argv += devices
    for source, target, opts in mounts:
        argv += ["-v", ":".join(p for p in (source, target, opts) if p)]
    for key, value in passed.items():
        # a secret's value comes from the engine's own environment, never the command line
        argv += ["-e", key] if is_secret_env(key) else ["-e", f"{key}={value}"]
    argv += ["-w", str(cwd), *section.run_args, section.image, *inner]
    return ContainerCommand(engine, argv, {}, notices)
