"""The ``launcher:`` section: which executor runs a job, and how.

One precedence rule, later wins, with provenance for every key:
``~/.primus.yaml`` < project file (``./.primus.yaml``, or ``--launcher-config FILE``)
< Slurm's ``SLURM_*`` (inside a job step) < ``NNODES``/``NODE_RANK``/``GPUS_PER_NODE``/
``MASTER_ADDR``/``MASTER_PORT``/``PRIMUS_JOB_ID`` < command-line flags.

Each file holds a ``launcher:`` mapping (other top-level keys are refused, so a typo is
never silently ignored). Unknown keys and wrong types are one-line errors (exit 2).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from primus.config.errors import ConfigError, did_you_mean
from primus.config.provenance import Provenance, merge_layer
from primus.config.schema import validate_model
from primus.config.values import MAX_COUNT, parse_count
from primus.config.yaml_source import Layer, load_yaml_layer

USER_FILE = "~/.primus.yaml"
PROJECT_FILE = ".primus.yaml"
EXECUTORS = ("auto", "local", "multi-node", "slurm", "srun", "container")


class SlurmSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    partition: str | None = None
    time: str | None = None
    account: str | None = None
    gpus_per_node: int | None = Field(None, ge=0, description="#SBATCH --gpus-per-node (and processes per node)")
    job_name: str | None = None
    # sbatch --signal=B:<sig>@<seconds>: the batch shell gets it and forwards it to every task
    signal: str = Field("TERM@120", pattern=r"^(TERM|USR1|USR2|INT)@\d+$")
    sbatch_args: list[str] = Field(default_factory=list, description="extra #SBATCH flags")
    srun_args: list[str] = Field(default_factory=list, description="extra srun flags")
    log_dir: str | None = None  # default: {run_dir}/slurm
    container_mode: Literal["auto", "pyxis", "engine"] = "auto"  # Slurm + container


FORWARD_ENV = (
    "PRIMUS_*", "MASTER_*", "NNODES", "NODE_RANK", "GPUS_PER_NODE", "NCCL_*", "RCCL_*", "GLOO_*", "TORCH_NCCL_*",
    "HF_*", "WANDB_*", "MLFLOW_*", "HSA_*", "HIP_*", "ROCR_*", "ROCM_*", "HIPBLASLT_*", "MIOPEN_*",
    "USE_HIPBLASLT", "TORCH_BLAS_PREFER_HIPBLASLT", "GPU_MAX_HW_QUEUES", "NVTE_*", "CUDA_DEVICE_MAX_CONNECTIONS",
    "OMP_NUM_THREADS",
)


class ContainerSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    image: str | None = None
    engine: Literal["auto", "docker", "podman", "apptainer"] = "auto"
    gpus: Literal["auto", "rocm", "nvidia", "none"] = "auto"
    ipc: Literal["host", "private"] = "host"
    shm_size: str | None = Field(None, pattern=r"^\d+[bkmgBKMG]?$")  # used with ipc: private
    mounts: list[str] = Field(default_factory=list, description="SRC[:DST[:OPTS]] extra bind mounts (data, ...)")
    env: list[str] = Field(default_factory=list, description="extra NAME or NAME=VALUE to pass in")
    # which host variables go in (fnmatch patterns): Primus', rendezvous, NCCL/RCCL/GLOO, ROCm/HIP/HSA tuning
    forward_env: list[str] = Field(default_factory=lambda: list(FORWARD_ENV))
    # secrets passed by NAME (the engine reads the value from its environment; never on a command line)
    pass_secrets: list[str] = Field(default_factory=lambda: ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY"])
    env_secrets: bool = False  # also pass every other *_TOKEN, *_KEY, *_SECRET, *PASSWORD*
    python: str | None = None  # the image's interpreter (e.g. python3); default: this one, repo/venv mounted
    # with the image's interpreter: `pip install --no-deps -e REPO` (and Primus' own small deps under a
    # constraint freezing the image's torch) when the container starts, as AMD Primus' prepare step does
    install: bool = True
    run_args: list[str] = Field(default_factory=list, description="extra flags for `ENGINE run`")


class LauncherConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    executor: Literal["auto", "local", "multi-node", "slurm", "srun", "container"] = "auto"
    nnodes: int | None = Field(None, ge=1)
    # elastic (torchrun --nnodes MIN:MAX): after a node is lost, a restart goes on with at least this many
    min_nodes: int | None = Field(None, ge=1)
    node_rank: int | None = Field(None, ge=0)
    nproc_per_node: int | None = Field(None, ge=1)
    master_addr: str | None = None
    master_port: int | None = Field(None, ge=1, le=65535)
    max_restarts: int = Field(0, ge=0)
    rdzv_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.\-]+$")
    rdzv_timeout: int = Field(300, ge=1, description="seconds for every node to join the rendezvous")
    rdzv_last_call: int = Field(30, ge=1, description="elastic: seconds a rendezvous waits for more nodes once the "
                                                      "minimum has joined (torchrun's last_call_timeout)")
    local_addr: str | None = None  # this node's address for worker traffic (default: its hostname)
    shared_fs: bool = True  # every node sees node 0's run dir; false: each node writes its own copy
    run_dir_timeout: int = Field(300, ge=1, description="seconds a node > 0 waits for node 0's run dir")
    slurm: SlurmSection = Field(default_factory=SlurmSection)
    container: ContainerSection = Field(default_factory=ContainerSection)

    def resolved_executor(self) -> str:
        if self.executor != "auto":
            return self.executor
        if self.container.image:
            return "container"
        return "multi-node" if (self.nnodes or 1) > 1 else "local"

    @property
    def wraps_container(self) -> bool:
        """Slurm and the container executor wrap the node command in ``container.image``."""
        return bool(self.container.image) and self.resolved_executor() in ("container", "slurm", "srun")


_ENV_KEYS = {"NNODES": "nnodes", "NODE_RANK": "node_rank", "GPUS_PER_NODE": "nproc_per_node",
             "MASTER_ADDR": "master_addr", "MASTER_PORT": "master_port", "PRIMUS_JOB_ID": "rdzv_id"}


def _file_layer(path: Path, label: str) -> Layer:
    layer = load_yaml_layer(path, label)
    unknown = [key for key in layer.data if key != "launcher"]
    if unknown:
        where = layer.origins.get(unknown[0], str(path))
        raise ConfigError(f"{where}: unknown top-level key '{unknown[0]}'{did_you_mean(unknown[0], ['launcher'])} "
                          "(a launcher file holds one 'launcher:' section)")
    if layer.data.get("launcher") is None:
        layer.data = {}
    elif not isinstance(layer.data["launcher"], dict):
        raise ConfigError(f"{layer.origins.get('launcher', path)}: 'launcher' must be a mapping")
    return layer


def slurm_step_env(env: dict[str, str]) -> dict[str, Any]:
    """NNODES / NODE_RANK / MASTER_ADDR inside a Slurm job step (one task per node)."""
    if not (env.get("SLURM_STEP_ID") and env.get("SLURM_NODEID") and env.get("SLURM_STEP_NUM_NODES")):
        return {}
    values: dict[str, Any] = {"nnodes": int(env["SLURM_STEP_NUM_NODES"]), "node_rank": int(env["SLURM_NODEID"]),
                              "rdzv_id": f"slurm-{env.get('SLURM_JOB_ID', '0')}"}
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if nodelist:
        first = first_slurm_host(nodelist)
        if first:
            values["master_addr"] = first
    return values


def first_slurm_host(nodelist: str) -> str | None:
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    hosts = out.stdout.split()
    return hosts[0] if out.returncode == 0 and hosts else None


def _env_layer(label: str, values: dict[str, Any], origins: dict[str, str]) -> Layer:
    return Layer(label, {"launcher": values}, {f"launcher.{k}": v for k, v in origins.items()})


def load_launcher_config(cli: dict[str, Any] | None = None, *, project_file: str | None = None,
                         env: dict[str, str] | None = None, cwd: Path | None = None,
                         cli_origins: dict[str, str] | None = None) -> tuple[LauncherConfig, Provenance]:
    """Merge the launcher layers and validate them; ``cli`` holds dotted launcher keys set by flags."""
    env = dict(os.environ if env is None else env)
    provenance = Provenance()
    merged: dict[str, Any] = {}
    user = Path(env.get("PRIMUS_USER_CONFIG", USER_FILE)).expanduser()
    if user.is_file():
        merge_layer(merged, _file_layer(user, "user launcher file"), provenance)
    if project_file is not None:
        merge_layer(merged, _file_layer(Path(project_file).expanduser(), "--launcher-config"), provenance)
    else:
        project = (cwd or Path.cwd()) / PROJECT_FILE
        if project.is_file():
            merge_layer(merged, _file_layer(project, "project launcher file"), provenance)

    slurm = slurm_step_env(env)
    if slurm:
        merge_layer(merged, _env_layer("Slurm job step", slurm, {k: f"Slurm ({k})" for k in slurm}), provenance)
    values, origins = {}, {}
    for name, key in _ENV_KEYS.items():
        if env.get(name, "") != "":
            values[key], origins[key] = _env_value(name, env[name]), f"${name}"
    if values:
        merge_layer(merged, _env_layer("environment", values, origins), provenance)

    if cli:
        data: dict[str, Any] = {}
        for dotted, value in cli.items():
            node = data
            *parents, leaf = dotted.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        origins = {f"launcher.{k}": (cli_origins or {}).get(k, f"command line --{k.split('.')[-1].replace('_', '-')}")
                   for k in cli}
        merge_layer(merged, Layer("command line", {"launcher": data}, origins), provenance)
    config = validate_model(LauncherConfig, merged.get("launcher") or {}, provenance, prefix="launcher")
    return config, provenance


_ENV_COUNTS = {"NNODES": (1, MAX_COUNT), "NODE_RANK": (0, MAX_COUNT), "GPUS_PER_NODE": (1, MAX_COUNT),
               "MASTER_PORT": (1, 65535)}


def _env_value(name: str, text: str) -> Any:
    if name in _ENV_COUNTS:
        minimum, maximum = _ENV_COUNTS[name]
        return parse_count(text, f"${name}", minimum=minimum, maximum=maximum)
    return text
