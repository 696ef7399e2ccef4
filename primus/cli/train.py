"""``primus train EXP [overrides] [--nproc-per-node N] [--slurm|--srun|--container IMAGE] [--dry-run] [-- SBATCH FLAGS]``."""
from __future__ import annotations

import argparse
import sys

from primus.config.values import count_flag, non_empty_flag


def node_count(text: str) -> int | tuple[int, int]:
    """``-N 4`` or, elastic as torchrun's ``--nnodes``, ``-N 2:4``."""
    low, sep, high = text.partition(":")
    if not sep:
        return count_flag(1)(text)
    counts = (count_flag(1)(low), count_flag(1)(high))
    if counts[0] > counts[1]:
        raise argparse.ArgumentTypeError(f"MIN:MAX needs MIN <= MAX (got {text!r})")
    return counts


def add_launcher_flags(parser: argparse.ArgumentParser, *, train: bool) -> None:
    """Executor flags shared by ``train`` and ``preflight`` (they override the ``launcher:`` files)."""
    group = parser.add_argument_group("launcher", "override the launcher: section of ~/.primus.yaml and "
                                                  "./.primus.yaml (or --launcher-config)")
    choice = group.add_mutually_exclusive_group()
    choice.add_argument("--executor", choices=["local", "multi-node", "slurm", "srun", "container"],
                        help="how to run (default: container if an image is set, multi-node if NNODES > 1, else local)")
    choice.add_argument("--slurm", dest="executor", action="store_const", const="slurm",
                        help="submit a Slurm batch job (one task per node); extra sbatch flags after --")
    choice.add_argument("--srun", dest="executor", action="store_const", const="srun",
                        help="run as a job step inside an existing Slurm allocation")
    group.add_argument("--launcher-config", metavar="FILE", help="project launcher file (default ./.primus.yaml)")
    group.add_argument("--nproc-per-node", type=count_flag(1),
                       help="processes on this node (env GPUS_PER_NODE, default 1)")
    group.add_argument("-N", "--nnodes", "--nodes", dest="nnodes", type=node_count, metavar="N|MIN:MAX",
                       help="nodes in the job (env NNODES); MIN:MAX with --max-restarts: after a node is lost, "
                            "continue on the survivors (at least MIN) from the latest checkpoint")
    group.add_argument("--node-rank", type=count_flag(0), help="this node's rank (env NODE_RANK, default 0)")
    group.add_argument("--master-addr", type=non_empty_flag, help="rendezvous host = node 0 (env MASTER_ADDR)")
    group.add_argument("--master-port", type=count_flag(1, 65535), help="rendezvous port (env MASTER_PORT)")
    group.add_argument("--rdzv-id", help="rendezvous / attempt id shared by all nodes (env PRIMUS_JOB_ID)")
    group.add_argument("--rdzv-timeout", type=count_flag(1), help="seconds for every node to join (default 300)")
    group.add_argument("--local-addr", help="this node's address for worker traffic (default: its hostname)")
    group.add_argument("--partition", help="Slurm partition")
    group.add_argument("--time", help="Slurm time limit")
    group.add_argument("--account", help="Slurm account")
    group.add_argument("--gpus-per-node", type=count_flag(1), help="Slurm GPUs per node (also processes per node)")
    group.add_argument("--container", metavar="IMAGE", help="run inside this image (docker, podman or apptainer)")
    group.add_argument("--container-engine", choices=["auto", "docker", "podman", "apptainer"])
    group.add_argument("--container-python", metavar="PY",
                       help="the image's own interpreter (e.g. python3): Primus is installed into it with "
                            "pip install --no-deps -e at start, keeping the image's torch")
    group.add_argument("--container-env-secrets", action="store_const", const=True,
                       help="also pass *_TOKEN/*_KEY/*_SECRET/*PASSWORD* variables into the container")
    if train:
        group.add_argument("--max-restarts", type=count_flag(0),
                           help="restart failed workers up to K times (torchelastic); they resume from the latest "
                                "checkpoint")
        group.add_argument("--no-shared-fs", dest="shared_fs", action="store_const", const=False,
                           help="nodes > 0 write their own copy of the run dir instead of waiting for node 0's")
        group.add_argument("--run-dir-timeout", type=count_flag(1),
                           help="seconds a node > 0 waits for node 0's run dir")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train", allow_abbrev=False, help="train an experiment",
        description="Resolve EXP (+ key=value / --key value overrides) and train it, here, on N nodes, "
                    "through Slurm or in a container.",
    )
    parser.add_argument("exp", nargs="?", help="experiment YAML")
    # AMD Primus spellings of the same command: `train --config EXP`, `train pretrain --config EXP`
    parser.add_argument("--config", dest="config_file", metavar="EXP", help="experiment YAML (AMD Primus spelling)")
    parser.add_argument("--module", help="module to run (default: pre_trainer)")
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument("--resume", dest="resume", action="store_const", const="always", default=None,
                        help="continue the existing run even if it completed (default: resume an interrupted "
                             "run automatically, refuse a completed one; primus.resume in the experiment)")
    resume.add_argument("--no-resume", dest="resume", action="store_const", const="never",
                        help="refuse to touch an existing run directory")
    parser.add_argument("--dry-run", action="store_true", help="print what would run (command lines or the "
                                                               "sbatch script) and exit")
    parser.add_argument("--device", metavar="NAME", help="with --dry-run: admit the run for this device (mi300x, "
                                                         "mi355x, h100 ...; default: this host's), its heaviest rank "
                                                         "checked against the device's memory")
    parser.add_argument("--force", action="store_true", help="launch even when the plan says a rank does not fit "
                                                             "the device's usable memory")
    parser.add_argument("--build", action="store_true", help="with --dry-run: also build each pipeline stage's real "
                                                             "model on the meta device for the whole world (the "
                                                             "engine's layout errors, per-rank bytes)")
    parser.add_argument("--verbose", action="store_true",
                        help="also show engine warnings and third-party progress bars on the console "
                             "(they are always in logs/.../warning.log, debug.log)")
    add_launcher_flags(parser, train=True)
    parser.set_defaults(handler=_train, accepts_overrides=True)


def experiment_argument(args: argparse.Namespace, extras: list[str]) -> str:
    """``EXP``, ``--config EXP`` or AMD Primus's ``pretrain --config EXP``; a stray override goes back to extras."""
    from primus.config.errors import ConfigError

    if args.config_file is None:
        if args.exp is None:
            raise ConfigError("train: give the experiment file (primus train EXP.yaml)")
        return args.exp
    if args.exp is not None and args.exp != "pretrain":
        if "=" not in args.exp:
            raise ConfigError(f"train: '{args.exp}' and --config {args.config_file}: give one experiment file "
                              f"(AMD Primus's `train pretrain --config EXP` is accepted)")
        extras.insert(0, args.exp)  # argparse took an override for the optional positional
    return args.config_file


def _train(args: argparse.Namespace, extras: list[str]) -> int:
    from pathlib import Path

    from primus.config.errors import ConfigError
    from primus.config.resolve import resolve_experiment
    from primus.launch import executors
    from primus.launch.job import (admit_module, launch_target, memory_admission, plan_module, run_training_job,
                                   select_module)
    from primus.launch.plan import plan_from_config
    from primus.runtime.registry import backend_defaults, backend_derived
    from primus.runtime.rundir import RunDir

    args.exp = experiment_argument(args, extras)
    if args.device:
        from primus.plan.estimate import device_memory_bytes

        device_memory_bytes(args.device)  # an unknown device is a user error before any parsing
    if args.verbose:
        import os

        os.environ["PRIMUS_VERBOSE"] = "1"  # read by every rank's log setup (primus.logs.setup)
    overrides, sbatch_extra = executors.split_passthrough(extras, sys.argv[1:])
    config, _ = executors.launcher_from_args(args)
    executor = config.resolved_executor()
    if sbatch_extra and executor != "slurm":
        raise ConfigError(f"flags after --: {' '.join(sbatch_extra)} are sbatch flags (use with --slurm)")
    resolved = resolve_experiment(args.exp, overrides, backend_defaults, backend_derived)
    for line in resolved.provenance.overridden:  # Primus replaced something the user wrote: say so
        print(f"[primus] derived {line}", file=sys.stderr, flush=True)
    module = select_module(resolved, args.module)
    # the flag wins; else the experiment's primus.resume (AMD Primus: auto_continue_train); else auto
    args.resume = args.resume or (module.params.get("primus") or {}).get("resume") or "auto"
    target = launch_target(args.device, dry_run=args.dry_run or executor not in ("local", "multi-node"))
    if executor in ("local", "multi-node"):
        return run_training_job(resolved, module, plan_from_config(config), resume=args.resume,
                                dry_run=args.dry_run, argv=["primus", *sys.argv[1:]], target=target,
                                force=args.force, build=args.build)

    passthrough = [*(["--module", args.module] if args.module else []), *(["--verbose"] if args.verbose else []),
                   *({"always": ["--resume"], "never": ["--no-resume"]}.get(args.resume, []))]
    request = executors.NodeRequest("train", [str(Path(args.exp).absolute())], overrides, passthrough,
                                    args.launcher_config)
    run_dir = RunDir.of(resolved.spec)
    if executor == "container":
        return executors.run_container(request, config, workspace=run_dir.path.parents[2], dry_run=args.dry_run,
                                       name=f"primus-{resolved.spec.exp_name}-{config.node_rank or 0}")
    if not config.wraps_container:  # fail before queueing: the engine must accept every key
        nproc = config.nproc_per_node or config.slurm.gpus_per_node or 1
        adapter, plan = plan_module(resolved, module, nproc * (config.nnodes or 1), target=target)
        if args.device:  # the nodes' device, named: admit here too (each node admits on its own device)
            admit_module(resolved, module, adapter, plan, target)
            memory_admission(plan, target, args.force)  # and its heaviest rank must fit it before queueing
    if not args.dry_run:
        run_dir.decide_resume(args.resume)  # refuse a completed run now, not after the queue wait
    if executor == "srun":
        return executors.run_srun(request, config, dry_run=args.dry_run)
    return executors.run_slurm(request, config, run_dir=run_dir.path, exp_name=resolved.spec.exp_name,
                               extra_sbatch=sbatch_extra, dry_run=args.dry_run)
