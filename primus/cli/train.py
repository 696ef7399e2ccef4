"""``primus train EXP [overrides] [--nproc-per-node N] [--dry-run] [--resume | --no-resume]``."""
from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train", allow_abbrev=False, help="train an experiment",
        description="Resolve EXP (+ key=value / --key value overrides) and train it.",
    )
    parser.add_argument("exp", help="experiment YAML")
    parser.add_argument("--module", help="module to run (default: pre_trainer)")
    parser.add_argument("--nproc-per-node", type=int, help="processes on this node (env GPUS_PER_NODE, default 1)")
    parser.add_argument("--nnodes", type=int, help="nodes in the job (env NNODES, default 1)")
    parser.add_argument("--node-rank", type=int, help="this node's rank (env NODE_RANK, default 0)")
    parser.add_argument("--master-addr", help="rendezvous host (env MASTER_ADDR)")
    parser.add_argument("--master-port", type=int, help="rendezvous port (env MASTER_PORT; free port if unset)")
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument("--resume", dest="resume", action="store_const", const="always", default="auto",
                        help="continue the existing run even if it completed (default: resume an interrupted "
                             "run automatically, refuse a completed one)")
    resume.add_argument("--no-resume", dest="resume", action="store_const", const="never",
                        help="refuse to touch an existing run directory")
    parser.add_argument("--max-restarts", type=int, default=0,
                        help="restart failed workers up to K times (torchelastic); they resume from the latest checkpoint")
    parser.add_argument("--dry-run", action="store_true", help="print the resolved summary and process command")
    parser.set_defaults(handler=_train, accepts_overrides=True)


def _train(args: argparse.Namespace, overrides: list[str]) -> int:
    from primus.config.resolve import resolve_experiment
    from primus.launch.job import run_training_job, select_module
    from primus.launch.local import LaunchPlan
    from primus.runtime.registry import backend_defaults

    resolved = resolve_experiment(args.exp, overrides, backend_defaults)
    module = select_module(resolved, args.module)
    plan = LaunchPlan.from_env(args.nproc_per_node, args.nnodes, args.node_rank, args.master_addr, args.master_port,
                               max_restarts=args.max_restarts)
    return run_training_job(resolved, module, plan, resume=args.resume, dry_run=args.dry_run,
                            argv=["primus", *sys.argv[1:]])
