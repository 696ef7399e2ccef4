"""A training job, as each node's launcher runs it. One story for node 0 and the others:

1. validate everything (nothing is written before this passes);
2. claim the run directory: node 0 locks it, applies the resume policy, prepares, writes the
   resolved config and the payload, and opens an attempt in the manifest; a node > 0 waits for
   node 0's payload of this attempt (shared filesystem) or writes its own copy;
3. launch this node's workers, watching the peers of a multi-node job;
4. record the end (node 0) and report: one ``[primus] FAILED`` line per failure, then one status line.
"""
from __future__ import annotations

import os
import shutil
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from primus.config.errors import ConfigError, mask_secrets
from primus.config.resolve import ResolvedExperiment, ResolvedModule
from primus.config.schema import PrimusOptions, validate_model
from primus.launch.local import LaunchResult, LauncherInterrupted, StopsRaise, launch_workers, summarize_error
from primus.launch.multinode import LeaderMissing, PeerWatch, wait_for_leader
from primus.launch.plan import LaunchPlan
from primus.runtime.adapter import BackendAdapter, CheckpointSpec, EnginePlan, ModuleConfig
from primus.plan.target import Target, host_target, target_for
from primus.runtime.admission import Admission, admit
from primus.runtime.checkpoints import newest_usable
from primus.runtime.goodput import line as goodput_line
from primus.runtime.hangs import HangWatch
from primus.runtime.registry import get_adapter
from primus.runtime.rundir import INTERRUPTED, ExitCode, RunDir
from primus.runtime.train import hand_over_plan

TRAIN_TARGET = "primus.runtime.train:train_worker"
DISK_FULL_BYTES = 16 * 2**20


def select_module(resolved: ResolvedExperiment, name: str | None) -> ResolvedModule:
    if name is None:
        name = "pre_trainer" if "pre_trainer" in resolved.modules else next(iter(resolved.modules))
    if name not in resolved.modules:
        raise ConfigError(f"--module {name}: no such module (modules: {', '.join(resolved.modules)})")
    return resolved.modules[name]


def plan_module(resolved: ResolvedExperiment, module: ResolvedModule, world_size: int | None = None, *,
                check_paths: bool = False, require_engine: bool = True, run_dir: Path | None = None,
                target: Target | None = None) -> tuple[BackendAdapter, EnginePlan]:
    """The module's ``EnginePlan``, built once for ``target`` (default: this host's device): every key
    accepted by the engine's own config, the layout checked against ``world_size`` when given, and
    (``check_paths``) its input files present. A plan for a GPU target never reads this host's CPU."""
    adapter = get_adapter(module.framework, resolved.provenance.describe(f"modules.{module.name}.framework"))
    if require_engine:
        adapter.require_installed()
    stage = adapter.canonical_stage(module.stage, resolved.provenance.describe(f"modules.{module.name}.stage"))
    validate_model(PrimusOptions, module.params.get("primus") or {}, resolved.provenance,  # every backend's
                   f"modules.{module.name}.primus")
    plan = adapter.plan(ModuleConfig.of(module, stage), world_size, resolved.provenance, run_dir=run_dir,
                        device=(target or host_target()).torch_device)
    if require_engine:
        adapter.import_engine()
    if check_paths:
        adapter.check_inputs(plan, resolved.provenance)
    return adapter, plan


def describe_module(resolved: ResolvedExperiment, module: ResolvedModule, world_size: int | None = None, *,
                    target: Target | None = None):
    """(ModelSpec, ParallelLayout) of the module, as ``primus plan`` needs them: without the engine where the
    adapter can (its argument table, a generated model table); planned for ``target`` (default: this host's)."""
    return describe_plan(resolved, module, world_size, target=target)[1:3]


def describe_plan(resolved: ResolvedExperiment, module: ResolvedModule, world_size: int | None = None, *,
                  target: Target | None = None) -> tuple[BackendAdapter, "ModelSpec | None", "ParallelLayout | None",
                                                         EnginePlan]:
    """(adapter, model, layout, plan) for ``primus plan``: the adapter's own plan where it needs no engine
    (Megatron's argument table); else the model and layout its generated table tells (TorchTitan: no torch
    import) in a plan without engine config, enough for admission, which reads the module's settings."""
    adapter = get_adapter(module.framework, resolved.provenance.describe(f"modules.{module.name}.framework"))
    if getattr(adapter, "plans_without_engine", False):
        plan = plan_module(resolved, module, world_size, require_engine=False, target=target)[1]
        return adapter, plan.model, plan.layout, plan
    stage = adapter.canonical_stage(module.stage, resolved.provenance.describe(f"modules.{module.name}.stage"))
    validate_model(PrimusOptions, module.params.get("primus") or {}, resolved.provenance, f"modules.{module.name}.primus")
    config = ModuleConfig.of(module, stage)
    model, layout = adapter.describe(config, world_size, resolved.provenance,
                                     device=(target or host_target()).torch_device)
    return adapter, model, layout, EnginePlan(config, world_size, None, CheckpointSpec(Path(".")), model, layout)


@dataclass
class Job:
    """What one node's launcher works with, validated."""

    resolved: ResolvedExperiment
    module: ResolvedModule
    adapter: BackendAdapter
    engine_plan: EnginePlan  # built once here; workers rebuild it from config.resolved.yaml
    plan: LaunchPlan
    run_dir: RunDir
    argv: list[str]
    outcome: LaunchResult = field(default_factory=lambda: LaunchResult(ExitCode.FAILED, ["launcher interrupted"]))
    saved_tree: dict = field(init=False)  # config.resolved.yaml: every secret a ${VAR} reference
    secret_env: dict[str, str] = field(init=False)  # the variables those references name, for the workers

    def __post_init__(self) -> None:
        self.saved_tree, self.secret_env = self.resolved.saved_tree()

    @property
    def who(self) -> str:
        """'' on node 0, 'node N ' on the others (the prefix of their status lines)."""
        return "" if self.plan.is_node_zero else f"node {self.plan.node_rank} "


def validate_keys(resolved: ResolvedExperiment, module: ResolvedModule,
                  target: Target | None = None) -> tuple[BackendAdapter, EnginePlan] | None:
    """Every key against the backend's own tables, without importing the engine (``validate --no-engine``):
    the plan, to admit. None where the backend's keys are the engine's own config classes (only the Primus
    block is checked)."""
    adapter = get_adapter(module.framework, resolved.provenance.describe(f"modules.{module.name}.framework"))
    if getattr(adapter, "plans_without_engine", False):
        return plan_module(resolved, module, require_engine=False, target=target)
    adapter.canonical_stage(module.stage, resolved.provenance.describe(f"modules.{module.name}.stage"))
    validate_model(PrimusOptions, module.params.get("primus") or {}, resolved.provenance,
                   f"modules.{module.name}.primus")
    return None


def admit_module(resolved: ResolvedExperiment, module: ResolvedModule, adapter: BackendAdapter,
                 plan: EnginePlan, target: Target) -> Admission:
    """Admission of the module on ``target`` (``primus.runtime.admission``): raises ConfigError (exit 2,
    one line) for the first setting the target cannot run; the same call for every command."""
    return admit(adapter, plan, target, module.translations, resolved.provenance).check()


def launch_target(device: str | None, *, dry_run: bool) -> Target:
    """The target of ``train``: ``--device`` names it for a dry-run; a launch runs on this host's device."""
    target = target_for(device)
    if not dry_run and target.assumed:
        raise ConfigError(f"--device {device}: this host has no {target.name} ({host_target().name} here); "
                          "--device names the target of config validate, plan and train --dry-run, a launch runs "
                          "on the device it is started on")
    return target


def run_training_job(resolved: ResolvedExperiment, module: ResolvedModule, plan: LaunchPlan, *,
                     resume: str, dry_run: bool, argv: list[str], target: Target | None = None, force: bool = False,
                     build: bool = False) -> int:
    """``target``: the device of a dry-run (``--device``); a launch runs on this host's device. ``force``: launch
    even when the heaviest rank does not fit it; ``build``: with ``dry_run``, the fake-world build too."""
    run_dir = RunDir.of(resolved.spec)
    target = target or host_target()
    adapter, engine_plan = plan_module(resolved, module, plan.world_size, check_paths=True, run_dir=run_dir.path,
                                       target=target)
    admission = admit_module(resolved, module, adapter, engine_plan, target)  # before anything is written
    job = Job(resolved, module, adapter, engine_plan, plan.with_port(), run_dir, argv)
    fits = memory_admission(engine_plan, target, force)  # memory_check.py
    if dry_run:
        _print_dry_run(job, admission)
        if fits:
            print(fits)
        if build:
            from primus.launch.memory_check import fake_world

            print(fake_world(engine_plan, plan.world_size))
        return ExitCode.COMPLETED
    os.environ.update(job.secret_env)  # literal secrets reach the workers by environment, nowhere else
    claim = _claim_as_node_zero if plan.is_node_zero else _join_as_other_node
    try:
        with StopsRaise() as stops, claim(job, resume):
            job.outcome = _launch(job, stops)
    except LauncherInterrupted as stop:
        job.outcome = LaunchResult(128 + stop.signum, [f"{stop} before its workers ended; run the same command to "
                                                       "resume"])
    except LeaderMissing as missing:
        job.outcome = LaunchResult(ExitCode.FAILED, [str(missing)])
    except ConfigError:
        raise
    except Exception as exc:  # the launcher's own failure (a full disk, torchrun): one line, traceback in a file
        job.outcome = LaunchResult(ExitCode.FAILED, [_launcher_error(job, exc)])
    return _report(job)


def memory_admission(engine_plan: EnginePlan, target: Target, force: bool) -> str | None:
    """Before any rank starts, the plan's heaviest rank against the target's memory (a GPU the plan knows): a
    ConfigError when it does not fit, unless ``force``; a CPU run or an unknown GPU: nothing to check. The plan
    is the target's (its dtypes and kernels), whatever this host is."""
    from primus.launch.memory_check import refuse_if_too_big
    from primus.plan.devices import DEVICE_MEMORY_GIB

    if force or not target.gpu or target.name not in DEVICE_MEMORY_GIB:
        return None
    return refuse_if_too_big(engine_plan.model, engine_plan.layout, target.name)


def _print_dry_run(job: Job, admission: Admission) -> None:
    module = job.module
    print(f"experiment: {job.resolved.spec.exp_name} ({module.framework} {job.adapter.installed_version()}, "
          f"stage {module.stage}, module {module.name})")
    print(f"run dir:    {job.run_dir}")
    print(f"processes:  {job.plan.world_size} ({job.plan.nnodes} node(s) x {job.plan.nproc_per_node})")
    print(f"admission:  {admission.summary()}")
    print(f"command:    {job.plan.describe(TRAIN_TARGET, job.run_dir.payload)}")
    from primus.compat.differs import lines_for

    for text in lines_for(module, job.engine_plan.engine_config):  # what the files say and what runs differ
        print(text)


def _say(message: str) -> None:
    print(f"[primus] {message}", flush=True)


def _prepare_and_save(job: Job, resuming: bool) -> str:
    """Build what the run needs before any rank starts, then write what the workers read."""
    job.adapter.prepare(job.engine_plan, _say)
    config_hash = job.run_dir.write_config(job.saved_tree)
    job.run_dir.write_payload(module=job.module.name, resume=resuming, attempt=job.plan.rdzv_id)
    return config_hash


@contextmanager
def _claim_as_node_zero(job: Job, resume: str) -> Iterator[None]:
    """Own the run dir for the launch: lock, resume policy, config, payload and a manifest attempt
    whose end is recorded however the launch ends (an interruption included)."""
    run_dir = job.run_dir
    resuming = run_dir.path.is_dir() and run_dir.decide_resume(resume)
    if resuming:  # refuse before writing even the lock file
        newest_usable(run_dir.checkpoints, warn=lambda _message: None)
    problem = job.adapter.resume_problem(job.engine_plan, resuming)  # a layout the engine cannot reshard
    if problem:
        raise ConfigError(f"resume: {problem}")
    run_dir.create()
    with run_dir.lock():
        resuming = run_dir.decide_resume(resume)
        if resuming:  # a damaged newest checkpoint: fall back to an older one (moving it aside), or refuse
            newest_usable(run_dir.checkpoints, warn=lambda message: _say(f"warning: {message}"), move_damaged=True)
        config_hash = _prepare_and_save(job, resuming)
        run_dir.clear_preempted()
        try:  # from here on, the attempt's end is recorded however the launch ends
            run_dir.start_attempt(engine=job.module.framework, engine_version=job.adapter.installed_version(),
                                  world_size=job.plan.world_size, config_hash=config_hash, argv=job.argv)
            _say(f"{'resuming' if resuming else 'starting'} {job.resolved.spec.exp_name} -> {run_dir}")
            yield
        except (LauncherInterrupted, KeyboardInterrupt) as stop:
            _record_end(run_dir, 128 + getattr(stop, "signum", 2), status=INTERRUPTED, note=str(stop) or "SIGINT")
            raise
        except BaseException:
            _record_end(run_dir, ExitCode.FAILED)
            raise
        else:
            _record_end(run_dir, job.outcome.exit_code, plot=True)


@contextmanager
def _join_as_other_node(job: Job, resume: str) -> Iterator[None]:
    """A node > 0 never claims the run dir: it waits for node 0's attempt, or (no shared
    filesystem) writes its own copy of what its workers read."""
    if job.plan.shared_fs:
        wait_for_leader(job.run_dir, job.plan)
    else:
        job.run_dir.create()
        _prepare_and_save(job, resuming=resume != "never" and job.run_dir.checkpoints.is_dir())
    _say(f"node {job.plan.node_rank}/{job.plan.nnodes} of {job.resolved.spec.exp_name}: starting "
         f"{job.plan.nproc_per_node} worker(s) -> {job.run_dir}")
    yield


def _launch(job: Job, stops: StopsRaise) -> LaunchResult:
    """This node's workers, the peers lost meanwhile, and the preemption marker read."""
    try:
        with PeerWatch(job.run_dir, job.plan) as peers, _hang_watch(job):  # name a lost peer, a hung rank
            if job.plan.in_process:  # the worker runs in this process: it takes this plan, not a rebuilt one
                hand_over_plan(job.run_dir.path, job.module.name, job.engine_plan)
            result = launch_workers(TRAIN_TARGET, job.run_dir.payload, job.plan)
            lost = peers.lost_peers() if result.exit_code != ExitCode.COMPLETED else []
    finally:
        stops.install()  # torchrun / an in-process worker took the signals over
    exit_code = job.run_dir.outcome(result.exit_code)
    if exit_code == ExitCode.PREEMPTED:
        return LaunchResult(exit_code, [])
    return LaunchResult(exit_code, lost + result.failures)


def _hang_watch(job: Job) -> HangWatch | nullcontext:
    """Node 0 names the rank a hung job waits for, from every rank's watchdog dump (shared run dir)."""
    if not job.plan.is_node_zero:
        return nullcontext()
    return HangWatch(job.run_dir.logs(job.module.name), job.plan.world_size, _say, job.run_dir.append_event)


def _launcher_error(job: Job, exc: Exception) -> str:
    """The line for a failure of the launcher itself; its traceback goes to a file, if one can be written."""
    where = ""
    try:
        log = job.run_dir.logs() / f"launcher-node{job.plan.node_rank}-error.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(mask_secrets("".join(traceback.format_exception(exc))))
        where = f" (traceback: {log})"
    except OSError:
        pass
    return f"launcher error on node {job.plan.node_rank}: {summarize_error(f'{type(exc).__name__}: {exc}')}{where}"


def _record_end(run_dir: RunDir, exit_code: int, *, status: str | None = None, note: str | None = None,
                plot: bool = False) -> None:
    """Manifest status and plot; a full or read-only disk is reported, never masks the run's own error."""
    try:
        run_dir.finish_attempt(exit_code, status, note)
        _say(goodput_line(run_dir.record_goodput()))  # every attempt's end: the run's goodput so far
        if plot:
            from primus.runtime.plot import plot_metrics

            plot_metrics(run_dir.path)
    except ImportError:
        print("[primus] matplotlib not installed: no metrics.png", file=sys.stderr)
    except OSError as exc:
        print(f"[primus] cannot record the end of the run in {run_dir}: {exc.strerror}", file=sys.stderr)


def _report(job: Job) -> int:
    run_dir, exit_code = job.run_dir, job.outcome.exit_code
    for line in map(mask_secrets, job.outcome.failures):
        print(f"[primus] FAILED {line} (see {run_dir.logs(job.module.name)}/rank-*/error.log)", file=sys.stderr)
    if exit_code not in (ExitCode.COMPLETED, ExitCode.PREEMPTED) and run_dir.path.is_dir() \
            and shutil.disk_usage(run_dir.path).free < DISK_FULL_BYTES:
        print(f"[primus] the disk holding {run_dir} is full ({shutil.disk_usage(run_dir.path).free} bytes free): "
              "free space, then run the same command to resume from the last complete checkpoint", file=sys.stderr)
    if exit_code == ExitCode.PREEMPTED:
        _say(f"{job.who}preempted: checkpoint saved; run the same command again to resume ({run_dir})")
    else:
        _say(f"{job.who}{'done' if exit_code == ExitCode.COMPLETED else 'failed'}: {run_dir}")
    return exit_code
