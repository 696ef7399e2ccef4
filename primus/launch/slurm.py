"""Slurm: render an sbatch script (one task per node) and submit it, or ``srun`` inside an allocation.

Each task runs that node's ``primus train`` with ``--executor multi-node``; inside the step
``NNODES``/``NODE_RANK`` come from ``SLURM_*`` (``primus.launch.config.slurm_step_env``) and
``MASTER_ADDR`` is the first host of ``scontrol show hostnames``. Slurm's own stdout/stderr
go to ``{run_dir}/slurm/<jobid>.out|.err``. Preemption and time limits: ``--signal=B:TERM@120``
signals the batch shell, which forwards it to the tasks; the workers checkpoint and the job ends
preempted (``ExitCode.PREEMPTED``).
With a container image, srun's pyxis ``--container-image`` is used when srun offers it, else
every task runs the container engine itself (``primus train --executor container``).
"""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import jinja2

import primus
from primus.config.errors import ConfigError
from primus.launch.config import LauncherConfig
from primus.runtime.rundir import ExitCode, RunDir

TEMPLATE_DIR = Path(__file__).parent / "templates"


def srun_supports_pyxis(srun: str = "srun") -> bool:
    try:
        out = subprocess.run([srun, "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--container-image" in out.stdout


def container_mode(config: LauncherConfig) -> str | None:
    """None (no image), 'pyxis' (srun --container-image) or 'engine' (docker/podman/apptainer per task)."""
    if not config.container.image:
        return None
    mode = config.slurm.container_mode
    if mode == "auto":
        mode = "pyxis" if srun_supports_pyxis() else "engine"
    return mode


def pyxis_flags(config: LauncherConfig, mounts: list[str]) -> list[str]:
    flags = [f"--container-image={config.container.image}"]
    if mounts:
        flags.append("--container-mounts=" + ",".join(mounts))
    return flags + ["--container-workdir=" + str(Path.cwd()), "--no-container-mount-home"]


def sbatch_flags(config: LauncherConfig, extra: list[str]) -> list[str]:
    slurm = config.slurm
    flags = []
    for name, value in (("partition", slurm.partition), ("time", slurm.time), ("account", slurm.account),
                        ("gpus-per-node", slurm.gpus_per_node)):
        if value is not None:
            flags.append(f"--{name}={value}")
    return flags + list(slurm.sbatch_args) + list(extra)


def render_sbatch(config: LauncherConfig, *, node_command: list[str], srun_flags: list[str], exp_name: str,
                  run_dir: Path, extra_sbatch: list[str], master_port: int, workdir: Path) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATE_DIR), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    env.filters["q"] = lambda value: shlex.quote(str(value))
    return env.get_template("sbatch.sh.j2").render(
        version=primus.__version__, exp_name=exp_name, run_dir=run_dir, job_name=config.slurm.job_name or
        f"primus-{exp_name}", nodes=config.nnodes or 1, log_dir=log_dir_of(config, run_dir),
        signal=config.slurm.signal, sbatch_flags=sbatch_flags(config, extra_sbatch), workdir=workdir,
        master_port=master_port, srun_flags=srun_flags, command=shlex.join(node_command),
        preempted_marker=RunDir(run_dir).preempted_marker, preempted_exit=int(ExitCode.PREEMPTED))


def log_dir_of(config: LauncherConfig, run_dir: Path) -> Path:
    return Path(config.slurm.log_dir).expanduser().absolute() if config.slurm.log_dir else run_dir / "slurm"


def step_flags(config: LauncherConfig, nodes: int) -> list[str]:
    """srun flags of the job step: one task per node."""
    return [f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", *config.slurm.srun_args]


def submit(script: str, script_path: Path, env: dict[str, str] | None = None) -> str:
    if not shutil.which("sbatch"):
        raise ConfigError("--slurm: 'sbatch' is not on PATH (run on a Slurm login node, or use --dry-run)")
    script_path.parent.mkdir(parents=True, exist_ok=True)
    script_path.write_text(script)
    out = subprocess.run(["sbatch", "--parsable", str(script_path)], capture_output=True, text=True, timeout=120,
                         env=env)
    if out.returncode != 0:
        reason = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"sbatch {script_path}: {reason}")
    match = re.match(r"^(\d+)", out.stdout.strip())
    if not match:
        raise ConfigError(f"sbatch {script_path}: unexpected output {out.stdout.strip()!r}")
    return match.group(1)


def allocation_nodes(env: dict[str, str]) -> int | None:
    value = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
    return int(value) if value and value.isdigit() else None
