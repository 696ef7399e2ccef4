"""The training job on one rank: read the resolved config, set up logs, run the adapter.

Workers never re-resolve the experiment: they read ``config.resolved.yaml`` written once by
the launching process, so ``${VAR}`` cannot resolve differently per rank.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from primus.config.secrets import restore_secrets, secret_values
from primus.logs.setup import setup_logging
from primus.runtime.adapter import EnginePlan, ModuleConfig
from primus.runtime.context import NonFiniteLoss, RunContext
from primus.plan.devices import device_peak
from primus.runtime.metrics import MetricsReporter
from primus.runtime.registry import get_adapter
from primus.runtime.preemption import PREEMPTED_EXIT, PREEMPTED_MARKER, Preempted, StopSignal
from primus.runtime.rundir import read_resolved_config, record_restart


# Plans the launcher built in this very process (a one-rank job runs its worker in-process): the
# worker takes it instead of parsing the same config a second time.
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


def train_worker(payload: dict[str, Any]) -> int:
    run_dir = Path(payload["run_dir"])
    tree = restore_secrets(read_resolved_config(run_dir))
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
        os.environ.setdefault("HF_TOKEN", primus_opts["hf_token"])
    # perf (#17): a peak on every device (measured GEMM on CPU, cached per host); rank 0 reports MFU
    peak, peak_source = device_peak(device_name, primus_opts.get("peak_dtype", "bf16"),
                                    primus_opts.get("peak_tflops"), probe=rank == 0)
    reporter = MetricsReporter(run_dir, rank=rank, world_size=world_size, device=device, peak_tflops=peak,
                               enable_tensorboard=primus_opts.get("tensorboard", True))
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    resume = bool(payload.get("resume")) or restarts > 0  # a restarted worker continues from its checkpoint
    ctx = RunContext(run_dir=run_dir, rank=rank, local_rank=local_rank, world_size=world_size, device=device,
                     logger=logger, reporter=reporter, resume=resume, stop=StopSignal().install())
    if restarts and rank == 0:
        record_restart(run_dir, restarts)
        logger.warning("worker restart %d (torchelastic): resuming from the latest checkpoint", restarts)
    module = ModuleConfig(name=module_name, framework=section["framework"],
                          stage=adapter.canonical_stage(section["stage"]), params=params)
    logger.info("%s %s on %s (rank %d/%d), stage %s", adapter.name, adapter.installed_version(),
                device_name, rank, world_size, module.stage)
    logger.info("MFU peak: %s TFLOP/s per device (%s)", "n/a" if peak is None else f"{peak:.4g}", peak_source)
    try:
        # the same plan the launcher built, rebuilt from config.resolved.yaml for this rank's run dir and device
        plan = _HANDED_OVER.pop((str(run_dir), module_name), None) or \
            adapter.plan(module, world_size, run_dir=run_dir, device=device)
        adapter.run(plan, ctx)
    except Preempted as stop:
        logger.warning("rank %d %s", rank, stop)
        if rank == 0:
            (run_dir / PREEMPTED_MARKER).write_text(json.dumps({"step": stop.step, "checkpointed": stop.checkpointed}))
        return PREEMPTED_EXIT
    except NonFiniteLoss as exc:
        logger.error("rank %d: %s", rank, exc)  # one line: a training outcome, not a Primus bug
        raise
    except BaseException:
        logger.exception("rank %d failed", rank)
        raise
    finally:
        reporter.close()
    return 0
