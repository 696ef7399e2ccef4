"""The training job on one rank: read the resolved config, set up logs, run the module's recipe.

Workers never re-resolve the experiment: they read ``config.resolved.yaml`` written once by the
launching process (with what its ``prepare`` localised, e.g. a Hub model's local copy), so
``${VAR}`` cannot resolve differently per rank and every rank plans from the launcher's inputs.
A worker in the launcher's own process takes the launcher's plan instead of building it again.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from primus.compat.runtime import announce, translations_of
from primus.config.errors import ConfigError
from primus.config.secrets import restore_secrets, secret_values
from primus.logs.setup import engine_output_to_log, engine_warning_summary, setup_logging
from primus.runtime.adapter import EnginePlan, ModuleConfig
from primus.runtime.context import NonFiniteLoss, RunContext
from primus.runtime.instruments import Instruments
from primus.plan.devices import device_peak
from primus.runtime.averages import StepAverages
from primus.runtime.reporter import MetricsReporter
from primus.launch.projection_check import projection_line
from primus.runtime.sinks.trackers import tracker_sinks
from primus.runtime.registry import get_adapter
from primus.runtime.preemption import Preempted, StopSignal
from primus.runtime.sample_hash import BatchDigest
from primus.runtime.rundir import ExitCode, RunDir


# Process-wide by nature: the plans the launcher built in this very process (a one-rank job runs its
# worker in-process), which the worker takes instead of planning the same module a second time.
_HANDED_OVER: dict[tuple[str, str], EnginePlan] = {}


def hand_over_plan(run_dir: Path, module: str, plan: EnginePlan) -> None:
    _HANDED_OVER[(str(run_dir), module)] = plan


def _device() -> tuple[str, str]:
    import torch

    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        return "cuda", torch.cuda.get_device_name(local_rank)
    return "cpu", "cpu"


def _process_group_exists() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _release_process_group() -> None:
    """End the group the engine's run created (AutoModel leaves its own for an atexit hook): the next module
    of a one-rank job, in this same process, and any caller of ``train_worker`` start without one."""
    import torch.distributed as dist

    if _process_group_exists():
        dist.destroy_process_group()


def train_worker(payload: dict[str, Any]) -> int:
    started = time.time()
    had_group = _process_group_exists()
    run_dir = Path(payload["run_dir"])
    tree = restore_secrets(RunDir(run_dir).read_config())
    module_name = payload["module"]
    section = tree["modules"][module_name]
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    logging_spec = tree.get("logging") or {}
    logger = setup_logging(run_dir / "logs", module_name, rank, world_size,
                           console_ranks=logging_spec.get("console_ranks", [0]),
                           console_level=logging_spec.get("level", "INFO"),
                           secrets=secret_values(os.environ))
    adapter = get_adapter(section["framework"])
    device, device_name = _device()
    params = section["params"]
    primus_opts = params.get("primus") or {}
    if primus_opts.get("hf_token"):
        os.environ["HF_TOKEN"] = primus_opts["hf_token"]  # the config's own token wins over the shell's
    # a peak on every device (measured GEMM on CPU, cached per host); rank 0 reports MFU
    peak, peak_source = device_peak(device_name, primus_opts.get("peak_dtype", "bf16"),
                                    primus_opts.get("peak_tflops"), probe=rank == 0)
    averages = StepAverages(primus_opts.get("avg_skip_steps", 0), primus_opts["avg_window"]) \
        if primus_opts.get("avg_window") else None
    reporter = MetricsReporter(run_dir, rank=rank, world_size=world_size, device=device, peak_tflops=peak,
                               enable_tensorboard=primus_opts.get("tensorboard", True), averages=averages,
                               extra_sinks=tracker_sinks(tree, module_name, run_dir, rank=rank))  # W&B, MLflow
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    resume = bool(payload.get("resume")) or restarts > 0  # a restarted worker continues from its checkpoint
    # phase clock, straggler report, watchdog and flight recorder: before the engine's process group exists
    instruments = Instruments.for_rank(primus_opts, log_dir=run_dir / "logs" / module_name, rank=rank,
                                       world_size=world_size, device=device)
    ctx = RunContext(run_dir=run_dir, rank=rank, local_rank=local_rank, world_size=world_size, device=device,
                     logger=logger, reporter=reporter, resume=resume, stop=StopSignal().install(),
                     save_last_checkpoint=primus_opts.get("save_last_checkpoint", True), instruments=instruments,
                     checkpoint_fail_on_error=(primus_opts.get("checkpoint") or {}).get("fail_on_error", False),
                     samples=BatchDigest(rank) if primus_opts.get("sample_hashes") else None)
    # AMD Primus names (primus/compat): say what each became; and what the launcher fetched from the Hub
    announce(translations_of(section), logger.info, ctx.log_derived)
    for item in section.get("localised") or []:
        ctx.log_derived(item["key"], item["value"], item["reason"])
    if restarts and rank == 0:
        before = RunDir(run_dir).record_restart(restarts, world_size)
        fewer = f" on {world_size} ranks (was {before}: elastic, a node was lost)" if before and before != world_size else ""
        logger.warning("worker restart %d (torchelastic): resuming from the latest checkpoint%s", restarts, fewer)
    module = ModuleConfig(name=module_name, framework=section["framework"],
                          stage=adapter.canonical_stage(section["stage"]), params=params)
    logger.info("%s %s on %s (rank %d/%d), stage %s", adapter.name, adapter.installed_version(),
                device_name, rank, world_size, module.stage)
    status = "failed"  # what the trackers record as the run's end
    ended_cleanly = False  # a rank that raises keeps its group: tearing it down can hang on a peer
    logger.info("MFU peak: %s TFLOP/s per device (%s)", "n/a" if peak is None else f"{peak:.4g}", peak_source)
    try:
        # the launcher's plan, or the same one rebuilt from config.resolved.yaml for this rank's run dir and device
        plan = _HANDED_OVER.pop((str(run_dir), module_name), None) or \
            adapter.plan(module, world_size, run_dir=run_dir, device=device)
        with engine_output_to_log(), instruments.running():  # engine prints: this rank's debug.log
            adapter.run(plan, ctx)
        status = "completed"
        ended_cleanly = True
        if rank == 0 and (line := projection_line(plan, reporter.step_times, device, device_name)):
            logger.info(line)  # predicted vs measured: every run adds a residual
    except Preempted as stop:
        status = "preempted"
        ended_cleanly = True
        logger.warning("rank %d %s", rank, stop)
        if rank == 0:
            RunDir(run_dir).mark_preempted(stop.step, stop.checkpointed)
        return ExitCode.PREEMPTED
    except NonFiniteLoss as exc:
        logger.error("rank %d: %s", rank, exc)  # one line: a training outcome, not a Primus bug
        raise
    except ConfigError as exc:  # a refusal only this rank could see (its host, its files): one line, exit 2
        logger.error("rank %d: %s", rank, exc)
        ended_cleanly = True
        return exc.exit_code
    except BaseException:
        logger.exception("rank %d failed", rank)
        raise
    finally:
        reporter.event(instruments.worker_event(restarts, started, time.time()))  # for the goodput (rank 0)
        reporter.close(status)
        if summary := engine_warning_summary():  # engine warnings stayed in warning.log: say so once
            logger.info(summary)
        if ended_cleanly and not had_group:
            _release_process_group()
    return 0
