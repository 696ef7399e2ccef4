"""``primus preflight``: check the cluster on every rank.

Exit status: 0 pass; 1 a ``fail`` finding; 2 a user error (bad option, bad YAML).
No torch import here: ``primus --help`` stays fast.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import sys
from typing import Any

from primus.config.errors import ConfigError
from primus.config.values import seconds_flag


def register(subparsers: argparse._SubParsersAction) -> None:
    pre = subparsers.add_parser(
        "preflight", allow_abbrev=False, help="check hosts, accelerators, network and collectives before a job",
        description="Run on every rank: environment, host, accelerator, network and connectivity checks, "
                    "GEMM and collective benchmarks, and (with EXP) the experiment's layout and memory. "
                    "Writes report.json/.md/.pdf on rank 0. Exit 0 pass, 1 any fail finding, 2 user error.")
    pre.add_argument("exp", nargs="?", help="experiment YAML (optional): also check its layout and memory")
    pre.add_argument("--quick", action="store_true", help="small fixed test set, well under a minute")
    pre.add_argument("--checks", help="comma list: environment,host,accelerators,network,connectivity,experiment")
    pre.add_argument("--tests", help="comma list: gemm,membw,allreduce,allgather,reducescatter,alltoall,sendrecv")
    pre.add_argument("--sizes", help="collective message sizes, e.g. 64K,1M,16M")
    pre.add_argument("--timeout", type=seconds_flag, default=60.0, help="seconds for every rank to join (default 60)")
    pre.add_argument("--report-dir", help="where rank 0 writes the report (default output/preflight/<time>)")
    pre.add_argument("--thresholds", help="YAML overriding primus/preflight/thresholds.yaml")
    pre.add_argument("--module", help="module of EXP to check (default: pre_trainer)")
    pre.add_argument("--dry-run", action="store_true", help="print what would run and exit")
    from primus.cli.train import add_launcher_flags

    add_launcher_flags(pre, train=False)  # --slurm/--srun/--container/-N ...: the same path as train
    pre.set_defaults(handler=_preflight, accepts_overrides=True)



def load_experiment(path: str, overrides: list[str], module_name: str | None, world_size: int | None = None):
    """(ModelSpec, ParallelLayout) of one module of an experiment, planned for this host."""
    plan = plan_experiment(path, overrides, module_name, world_size)[0]
    return plan.model, plan.layout


def plan_experiment(path: str, overrides: list[str], module_name: str | None, world_size: int | None = None,
                    target=None, *, admit: bool = False, say=None):
    """(EnginePlan, Admission or None) of one module of an experiment, planned for ``target`` (default:
    this host's device) without the engine's import (``primus.launch.job.describe_plan``) and, with
    ``admit``, its admission on it (refusals listed, not raised); ``say`` gets each ``differs:`` line (what
    the files say and what runs; the engine's own lines where the plan has its config)."""
    from primus.config.resolve import resolve_experiment
    from primus.launch.job import describe_plan, select_module
    from primus.plan.target import host_target
    from primus.runtime.admission import admit as admission_of
    from primus.runtime.registry import backend_defaults, backend_derived

    resolved = resolve_experiment(path, overrides, backend_defaults, backend_derived)
    module = select_module(resolved, module_name)
    target = target or host_target()
    adapter, model, layout, plan = describe_plan(resolved, module, world_size, target=target)
    admission = admission_of(adapter, plan, target, module.translations, resolved.provenance) if admit else None
    if say is not None:
        from primus.compat.differs import lines_for

        for text in lines_for(module, plan.engine_config):
            say(text)
    if model is None or layout is None:
        raise ConfigError(f"{path}: modules.{module.name} ({module.framework}): the plan has no model description "
                          "to estimate (an LLM needs its vocab_size known before the tokenizer loads; a Wan model "
                          "a local pipeline with transformer/config.json or a known Hub name)")
    return plan, admission



def build_options(args: argparse.Namespace, experiment: dict[str, Any] | None = None) -> dict[str, Any]:
    """The worker's options dict; validated here so a typo fails before any process starts."""
    from primus.preflight.options import PreflightOptions
    from primus.preflight.thresholds import load_thresholds

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    options = {"report_dir": args.report_dir or f"output/preflight/{stamp}", "quick": args.quick,
               "checks": args.checks, "tests": args.tests, "sizes": args.sizes, "timeout": args.timeout,
               "thresholds": args.thresholds, "experiment": experiment}
    validated = PreflightOptions.from_dict(options)
    load_thresholds(validated.thresholds)
    return validated.to_dict()


def _preflight(args: argparse.Namespace, overrides: list[str]) -> int:
    if overrides and not args.exp:
        raise ConfigError(f"overrides {' '.join(overrides)} given without an experiment")
    from pathlib import Path

    from primus.launch import executors
    from primus.launch.local import launch_workers
    from primus.launch.plan import plan_from_config

    overrides, sbatch_extra = executors.split_passthrough(overrides, sys.argv[1:])
    config, _ = executors.launcher_from_args(args)
    executor = config.resolved_executor()
    experiment = None
    if args.exp:  # the layout is judged against the job's world size (shard -1 fills it)
        from primus.preflight.checks.experiment import experiment_payload

        model, layout = load_experiment(args.exp, overrides, args.module, plan_from_config(config).world_size)
        experiment = experiment_payload(model, layout)
    options = build_options(args, experiment)
    if executor in ("local", "multi-node"):
        plan = plan_from_config(config).with_port()
        if args.dry_run:
            print(f"command:    {plan.describe('primus.preflight.worker:worker_main', Path('<options.json>'))}")
            return 0
        if plan.nnodes > 1:  # name a node that never comes, and still write the report
            from primus.preflight.rollcall import nodes_ready

            code = nodes_ready(options, plan)
            if code is not None:
                return code
        result = launch_workers("primus.preflight.worker:worker_main", options, plan)
        for line in result.failures:
            print(f"preflight: {line}", file=sys.stderr, flush=True)
        return result.exit_code
    # every node runs the same preflight, writing one report (rank 0) into one absolute directory
    report_dir = Path(options["report_dir"]).absolute()
    passthrough = ["--report-dir", str(report_dir), "--timeout", str(args.timeout)]
    for flag in ("checks", "tests", "sizes", "thresholds", "module"):
        if getattr(args, flag):
            passthrough += [f"--{flag}", str(getattr(args, flag))]
    if args.quick:
        passthrough.append("--quick")
    request = executors.NodeRequest("preflight", [str(Path(args.exp).absolute())] if args.exp else [], overrides,
                                    passthrough, args.launcher_config)
    if executor == "container":
        return executors.run_container(request, config, workspace=report_dir, dry_run=args.dry_run)
    if executor == "srun":
        return executors.run_srun(request, config, dry_run=args.dry_run)
    return executors.run_slurm(request, config, run_dir=report_dir, exp_name="preflight",
                               extra_sbatch=sbatch_extra, dry_run=args.dry_run)
