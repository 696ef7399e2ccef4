"""A training job from the launching process' side: claim the run dir, save, launch, record."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from primus.config.errors import ConfigError
from primus.config.resolve import ResolvedExperiment, ResolvedModule
from primus.launch.local import LaunchPlan, launch_workers
from primus.launch.multinode import PeerWatch, is_follower, run_follower_node
from primus.runtime.adapter import BackendAdapter, EnginePlan, ModuleConfig
from primus.runtime.context import host_device
from primus.runtime.train import hand_over_plan
from primus.runtime.registry import get_adapter
from primus.runtime.preemption import PREEMPTED_EXIT, PREEMPTED_MARKER
from primus.runtime.rundir import (RunDirLock, decide_resume, finish_manifest, make_run_dir, run_dir_of,
                                   start_manifest, write_resolved_config)

TRAIN_TARGET = "primus.runtime.train:train_worker"


def select_module(resolved: ResolvedExperiment, name: str | None) -> ResolvedModule:
    if name is None:
        name = "pre_trainer" if "pre_trainer" in resolved.modules else next(iter(resolved.modules))
    if name not in resolved.modules:
        raise ConfigError(f"--module {name}: no such module (modules: {', '.join(resolved.modules)})")
    return resolved.modules[name]


def plan_module(resolved: ResolvedExperiment, module: ResolvedModule, world_size: int | None = None, *,
                check_paths: bool = False, require_engine: bool = True,
                run_dir: Path | None = None) -> tuple[BackendAdapter, EnginePlan]:
    """The module's ``EnginePlan``, built once: every key accepted by the engine's own config, the
    layout checked against ``world_size`` when given, and (``check_paths``) its input files present."""
    adapter = get_adapter(module.framework, resolved.provenance.describe(f"modules.{module.name}.framework"))
    if require_engine:
        adapter.require_installed()
    stage = adapter.canonical_stage(module.stage, resolved.provenance.describe(f"modules.{module.name}.stage"))
    plan = adapter.plan(ModuleConfig.of(module, stage), world_size, resolved.provenance, run_dir=run_dir,
                        device=host_device())
    if require_engine:
        adapter.import_engine()
    if check_paths:
        adapter.check_inputs(plan, resolved.provenance)
    return adapter, plan


def run_training_job(resolved: ResolvedExperiment, module: ResolvedModule, plan: LaunchPlan, *,
                     resume: str, dry_run: bool, argv: list[str]) -> int:
    run_dir = run_dir_of(resolved.spec)
    adapter, engine_plan = plan_module(resolved, module, plan.world_size, check_paths=True, run_dir=run_dir)
    plan.with_port()
    payload_path = run_dir / "launch.json"
    if dry_run:
        print(f"experiment: {resolved.spec.exp_name} ({module.framework} {adapter.installed_version()}, "
              f"stage {module.stage}, module {module.name})")
        print(f"run dir:    {run_dir}")
        print(f"processes:  {plan.world_size} ({plan.nnodes} node(s) x {plan.nproc_per_node})")
        print(f"command:    {plan.describe(TRAIN_TARGET, payload_path)}")
        return 0
    if is_follower(plan):  # multi-node: node 0 owns the run dir (primus/launch/multinode.py)
        return run_follower_node(resolved, module, adapter, engine_plan, plan, run_dir, resume)
    make_run_dir(run_dir)
    with RunDirLock(run_dir):
        resuming = decide_resume(run_dir, resume)
        adapter.prepare(engine_plan, lambda message: print(f"[primus] {message}", flush=True))
        config_hash = write_resolved_config(run_dir, resolved.redacted_tree())
        payload_path.write_text(json.dumps({"run_dir": str(run_dir), "module": module.name, "resume": resuming,
                                            "attempt": plan.rdzv_id}))
        (run_dir / PREEMPTED_MARKER).unlink(missing_ok=True)
        manifest = start_manifest(run_dir, engine=module.framework, engine_version=adapter.installed_version(),
                                  world_size=plan.world_size, config_hash=config_hash, argv=argv)
        print(f"[primus] {'resuming' if resuming else 'starting'} {resolved.spec.exp_name} -> {run_dir}", flush=True)
        exit_code, failures = 1, ["launcher interrupted"]
        try:
            with PeerWatch(run_dir, plan) as peers:  # multi-node: name a lost peer on failure
                if plan.in_process:  # the worker runs in this process: it takes this plan, not a rebuilt one
                    hand_over_plan(run_dir, module.name, engine_plan)
                result = launch_workers(TRAIN_TARGET, payload_path, plan)
                lost = peers.lost_peers() if result.exit_code != 0 else []
            exit_code, failures = result.exit_code, lost + result.failures
            if exit_code != 0 and (run_dir / PREEMPTED_MARKER).exists():
                exit_code, failures = PREEMPTED_EXIT, []
        finally:
            _record_end(run_dir, manifest, exit_code, plan.node_rank == 0)
    for line in failures:
        print(f"[primus] FAILED {line} (see {run_dir / 'logs' / module.name}/rank-*/error.log)", file=sys.stderr)
    if exit_code not in (0, PREEMPTED_EXIT) and shutil.disk_usage(run_dir).free < 16 * 2**20:
        print(f"[primus] the disk holding {run_dir} is full ({shutil.disk_usage(run_dir).free} bytes free): "
              "free space, then run the same command to resume from the last complete checkpoint", file=sys.stderr)
    if exit_code == PREEMPTED_EXIT:
        print(f"[primus] preempted: checkpoint saved; run the same command again to resume ({run_dir})", flush=True)
    else:
        print(f"[primus] {'done' if exit_code == 0 else 'failed'}: {run_dir}", flush=True)
    return exit_code


def _record_end(run_dir: Path, manifest: dict, exit_code: int, plot: bool) -> None:
    """Manifest status and plot; a full or read-only disk is reported, never masks the run's own error."""
    try:
        finish_manifest(run_dir, manifest, exit_code)
        if plot:
            from primus.runtime.plot import plot_metrics

            plot_metrics(run_dir)
    except ImportError:
        print("[primus] matplotlib not installed: no metrics.png", file=sys.stderr)
    except OSError as exc:
        print(f"[primus] cannot record the end of the run in {run_dir}: {exc.strerror}", file=sys.stderr)
