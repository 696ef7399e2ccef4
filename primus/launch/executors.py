"""Pick and run an executor for ``primus train`` / ``primus preflight``.

- ``local``: this node's processes (``primus.launch.local``).
- ``multi-node``: this node's part of an N-node job (c10d rendezvous, ``primus.launch.multinode``).
- ``slurm``: render and submit an sbatch script, one task per node running ``multi-node``.
- ``srun``: the same job step, run inside an existing allocation.
- ``container``: this node's command inside docker/podman/apptainer.

Every executor honours ``--dry-run``: it prints exactly what it would run and exits 0.
The command each node (or container) runs is ``primus COMMAND ... --executor multi-node|local``
with every launcher setting spelled out as a flag, so it never re-selects the outer executor.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from primus.config.errors import ConfigError
from primus.config.secrets import secure_overrides
from primus.launch.config import LauncherConfig, first_slurm_host, load_launcher_config

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


@dataclass
class NodeRequest:
    """What the user asked for, to rebuild the per-node command line."""

    command: str  # "train" or "preflight"
    positional: list[str]  # [EXP] (absolute) or []
    overrides: list[str]
    passthrough: list[str] = field(default_factory=list)  # command-specific flags (--module, --resume, ...)
    launcher_config: str | None = None

    def secured(self) -> tuple["NodeRequest", dict[str, str]]:
        """This request with every literal secret override turned into a ``${PRIMUS_SECRET_*}``
        reference, and the variables to pass by name (scripts and command lines never hold a secret)."""
        overrides, env = secure_overrides(self.overrides)
        return replace(self, overrides=overrides), env


CLI_KEYS = {  # argparse dest -> launcher key
    "executor": "executor", "nnodes": "nnodes", "node_rank": "node_rank", "nproc_per_node": "nproc_per_node",
    "master_addr": "master_addr", "master_port": "master_port", "max_restarts": "max_restarts",
    "rdzv_id": "rdzv_id", "rdzv_timeout": "rdzv_timeout", "rdzv_last_call": "rdzv_last_call",
    "local_addr": "local_addr", "shared_fs": "shared_fs",
    "run_dir_timeout": "run_dir_timeout", "partition": "slurm.partition", "time": "slurm.time",
    "account": "slurm.account", "gpus_per_node": "slurm.gpus_per_node", "container": "container.image",
    "container_engine": "container.engine", "container_env_secrets": "container.env_secrets",
    "container_python": "container.python",
}


def launcher_from_args(args) -> tuple[LauncherConfig, Any]:
    cli = {key: getattr(args, dest) for dest, key in CLI_KEYS.items() if getattr(args, dest, None) is not None}
    if isinstance(cli.get("nnodes"), tuple):  # -N MIN:MAX (elastic)
        cli["min_nodes"], cli["nnodes"] = cli["nnodes"]
    return load_launcher_config(cli, project_file=getattr(args, "launcher_config", None))


def split_passthrough(extras: list[str], raw_argv: list[str]) -> tuple[list[str], list[str]]:
    """Overrides, and the extra sbatch flags given after ``--``."""
    if "--" in extras:
        i = extras.index("--")
        return extras[:i], extras[i + 1:]
    if "--" in raw_argv:
        tail = raw_argv[raw_argv.index("--") + 1:]
        if tail and extras[-len(tail):] == tail:
            return extras[:-len(tail)], tail
    return extras, []


def node_command(request: NodeRequest, config: LauncherConfig, executor: str, *, with_node_identity: bool,
                 python: str | None = None, container: bool = False, launcher_file: bool = True) -> list[str]:
    """The ``primus`` command line one node runs (inside a Slurm task or a container)."""
    argv = [python or sys.executable, "-m", "primus.cli.main", request.command, *request.positional,
            *request.overrides, *request.passthrough, "--executor", executor]
    if request.launcher_config and launcher_file:  # a container may not see the file: flags say it all
        argv += ["--launcher-config", str(Path(request.launcher_config).absolute())]
    if with_node_identity:
        nodes = f"{config.min_nodes}:{config.nnodes}" if config.min_nodes and config.nnodes else config.nnodes
        for flag, value in (("--nnodes", nodes), ("--node-rank", config.node_rank),
                            ("--master-addr", config.master_addr), ("--master-port", config.master_port),
                            ("--rdzv-id", config.rdzv_id)):
            if value is not None:
                argv += [flag, str(value)]
    nproc = config.nproc_per_node or config.slurm.gpus_per_node
    if nproc:
        argv += ["--nproc-per-node", str(nproc)]
    argv += ["--rdzv-timeout", str(config.rdzv_timeout)]
    if config.min_nodes is not None:
        argv += ["--rdzv-last-call", str(config.rdzv_last_call)]
    if request.command == "train":
        argv += ["--max-restarts", str(config.max_restarts), "--run-dir-timeout", str(config.run_dir_timeout)]
        if not config.shared_fs:
            argv.append("--no-shared-fs")
    if config.local_addr:
        argv += ["--local-addr", config.local_addr]
    if container:
        argv += ["--container", config.container.image, "--container-engine", config.container.engine]
        if config.container.python:
            argv += ["--container-python", config.container.python]
        if config.container.env_secrets:
            argv.append("--container-env-secrets")
    return argv


def run_forwarding(argv: list[str], env: dict[str, str] | None = None) -> int:
    """Run a child (container engine, srun), passing TERM/USR1/INT on to it; its exit status."""
    child = subprocess.Popen(argv, env=env)
    previous = {}

    def forward(signum, _frame):
        child.send_signal(signum)

    for sig in FORWARDED_SIGNALS:
        previous[sig] = signal.signal(sig, forward)
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


def run_container(request: NodeRequest, config: LauncherConfig, *, workspace: Path | None, dry_run: bool,
                  name: str | None = None) -> int:
    from primus.launch.container import build_container_command, mounts_for

    request, secret_env = request.secured()
    nnodes = config.nnodes or 1
    inner = node_command(request, config, "multi-node" if nnodes > 1 else "local", with_node_identity=True,
                         python=config.container.python, launcher_file=False)
    command = build_container_command(config.container, inner, explicit_env=secret_env, workspace=workspace, name=name,
                                      dry_run=dry_run)
    for notice in command.notices:
        print(f"[primus] container: {notice}", file=sys.stderr if not dry_run else sys.stdout, flush=True)
    if dry_run:
        print(f"command:    {command.describe()}")
        return 0
    for source, _, _ in mounts_for(workspace, config.container, dict(os.environ), Path.cwd()):
        Path(source).mkdir(parents=True, exist_ok=True)  # workspace and cache: the engine would make them root-only
    print(f"[primus] running in {command.engine}: {config.container.image}", flush=True)
    return run_forwarding(command.argv, {**os.environ, **secret_env, **command.env})  # docker -e NAME reads it here


def run_slurm(request: NodeRequest, config: LauncherConfig, *, run_dir: Path, exp_name: str,
              extra_sbatch: list[str], dry_run: bool) -> int:
    from primus.launch import slurm

    request, secret_env = request.secured()  # sbatch hands its environment to the job (--export=ALL)
    nodes = config.nnodes or 1
    port = config.master_port or 29500
    mode = slurm.container_mode(config)
    srun_flags = slurm.step_flags(config, nodes)
    if mode == "engine":
        command = node_command(request, config, "container", with_node_identity=False, container=True)
    else:
        command = node_command(request, config, "multi-node", with_node_identity=False, python=config.container.python
                               if mode == "pyxis" else None)
        if mode == "pyxis":
            from primus.launch.container import mounts_for

            mounts = [f"{s}:{t}" + (f":{o}" if o else "") for s, t, o in
                      mounts_for(run_dir.parents[2], config.container, dict(os.environ), Path.cwd())]
            srun_flags += slurm.pyxis_flags(config, mounts)
    script = slurm.render_sbatch(config, node_command=command, srun_flags=srun_flags, exp_name=exp_name,
                                 run_dir=run_dir, extra_sbatch=extra_sbatch, master_port=port, workdir=Path.cwd())
    log_dir = slurm.log_dir_of(config, run_dir)
    if dry_run:
        print(f"# sbatch script (submit: sbatch {log_dir}/<job>.sbatch); Slurm logs: {log_dir}/<jobid>.out|.err")
        print(script, end="")
        return 0
    log_dir.mkdir(parents=True, exist_ok=True)
    job_id = slurm.submit(script, log_dir / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.sbatch",
                          env={**os.environ, **secret_env})
    print(f"[primus] submitted Slurm job {job_id}: {nodes} node(s), {request.command} {exp_name}", flush=True)
    print(f"[primus] slurm logs: {log_dir}/{job_id}.out and {log_dir}/{job_id}.err", flush=True)
    print(f"[primus] run dir: {run_dir}  (cancel: scancel {job_id}; status: squeue -j {job_id})", flush=True)
    return 0


def run_srun(request: NodeRequest, config: LauncherConfig, *, dry_run: bool) -> int:
    """Inside an existing allocation (salloc, or a batch script): one task per node."""
    from primus.launch import slurm

    request, secret_env = request.secured()
    env = {**os.environ, **secret_env}
    if not env.get("SLURM_JOB_ID"):
        raise ConfigError("--srun: not inside a Slurm allocation (no SLURM_JOB_ID); use --slurm to submit a job")
    nodes = config.nnodes or slurm.allocation_nodes(env) or 1
    master = config.master_addr or first_slurm_host(env.get("SLURM_JOB_NODELIST", "")) or "127.0.0.1"
    step_env = {"MASTER_ADDR": master, "MASTER_PORT": str(config.master_port or 29500), "NNODES": str(nodes),
                "PRIMUS_JOB_ID": config.rdzv_id or f"slurm-{env['SLURM_JOB_ID']}-{int(time.time())}"}
    command = node_command(request, config, "multi-node", with_node_identity=False)
    argv = ["srun", *slurm.step_flags(config, nodes), *command]
    if dry_run:
        print("command:    " + shlex.join([f"{k}={v}" for k, v in step_env.items()] + argv))
        return 0
    return run_forwarding(argv, {**env, **step_env})
