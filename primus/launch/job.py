"""A training job from the launching process' side: claim the run dir, save, launch, record."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from primus.config.errors import ConfigError
from primus.config.resolve import ResolvedExperiment, ResolvedModule
from primus.launch.local import LaunchPlan, launch_workers
from primus.runtime.adapter import BackendAdapter, ModuleConfig
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


def validate_module(resolved: ResolvedExperiment, module: ResolvedModule, *, check_paths: bool = False) -> BackendAdapter:
    """Engine-level validation: the engine must be installed and accept every key."""
    adapter = get_adapter(module.framework, resolved.provenance.describe(f"modules.{module.name}.framework"))
    adapter.require_installed()
    stage = adapter.canonical_stage(module.stage, resolved.provenance.describe(f"modules.{module.name}.stage"))
    config = ModuleConfig(module.name, module.framework, stage, module.params)
    adapter.validate(config, resolved.provenance)
    if check_paths:
        adapter.check_inputs(config, resolved.provenance)
    return adapter


def run_training_job(resolved: ResolvedExperiment, module: ResolvedModule, plan: LaunchPlan, *,
                     resume: str, dry_run: bool, argv: list[str]) -> int:
    adapter = validate_module(resolved, module, check_paths=True)
    run_dir = run_dir_of(resolved.spec)
    plan.with_port()
    payload_path = run_dir / "launch.json"
    if dry_run:
        print(f"experiment: {resolved.spec.exp_name} ({module.framework} {adapter.installed_version()}, "
              f"stage {module.stage}, module {module.name})")
        print(f"run dir:    {run_dir}")
        print(f"processes:  {plan.world_size} ({plan.nnodes} node(s) x {plan.nproc_per_node})")
        print(f"command:    {plan.describe(TRAIN_TARGET, payload_path)}")
        return 0
    make_run_dir(run_dir)
    with RunDirLock(run_dir):
        resuming = decide_resume(run_dir, resume)
        config = ModuleConfig(module.name, module.framework, module.stage, module.params)
        adapter.prepare(config, lambda message: print(f"[primus] {message}", flush=True))
        config_hash = write_resolved_config(run_dir, resolved.redacted_tree())
        payload_path.write_text(json.dumps({"run_dir": str(run_dir), "module": module.name, "resume": resuming}))
        (run_dir / PREEMPTED_MARKER).unlink(missing_ok=True)
        manifest = start_manifest(run_dir, engine=module.framework, engine_version=adapter.installed_version(),
                                  world_size=plan.world_size, config_hash=config_hash, argv=argv)
        print(f"[primus] {'resuming' if resuming else 'starting'} {resolved.spec.exp_name} -> {run_dir}", flush=True)
        exit_code, failures = 1, ["launcher interrupted"]
        try:
            result = launch_workers(TRAIN_TARGET, payload_path, plan)
            exit_code, failures = result.exit_code, result.failures
            if exit_code != 0 and (run_dir / PREEMPTED_MARKER).exists():
                exit_code, failures = PREEMPTED_EXIT, []
        finally:
            finish_manifest(run_dir, manifest, exit_code)
            if plan.node_rank == 0:
                _plot(run_dir)
    for line in failures:
        print(f"[primus] FAILED {line} (see {run_dir / 'logs' / module.name}/rank-*/error.log)", file=sys.stderr)
    if exit_code == PREEMPTED_EXIT:
        print(f"[primus] preempted: checkpoint saved; run the same command again to resume ({run_dir})", flush=True)
    else:
        print(f"[primus] {'done' if exit_code == 0 else 'failed'}: {run_dir}", flush=True)
    return exit_code


def _plot(run_dir: Path) -> None:
    try:
        from primus.runtime.plot import plot_metrics

        plot_metrics(run_dir)
    except ImportError:
        print("[primus] matplotlib not installed: no metrics.png", file=sys.stderr)
