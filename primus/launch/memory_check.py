"""Before any rank starts: does the run fit its device, and does the engine accept its layout at its scale.

- ``refuse_if_too_big``: the plan's heaviest rank against the device's usable memory (the
  ``memory.usable_fraction`` threshold); one line naming the rank, its bytes and the budget. Refused when
  its exact state (weights, grads, optimizer) does not fit; when only the estimated activations tip it
  over, said as "may not fit" (AMD's own FP8 files run where the PyTorch-kernel estimate says no).
- ``fake_world``: each pipeline stage's real model built by the engine on the meta device for the
  whole world (``primus.plan.fakeworld``): what the engine refuses at that scale, and per-rank bytes.
"""
from __future__ import annotations

import importlib
import time

from primus.config.errors import ConfigError
from primus.plan.estimate import GIB
from primus.runtime.adapter import EnginePlan

# exact per-rank bytes (measured equal to the engines' tensors); activations are estimated and only measured on CPU
STATE = ("weights", "grads", "optimizer")
FAKE_WORLD_ENGINES = {"megatron": "megatron-core", "torchtitan": "TorchTitan"}


def device_budget(device: str, thresholds: str | None = None) -> tuple[int, float]:
    """(memory in bytes, usable fraction) of a named device."""
    from primus.plan.estimate import device_memory_bytes
    from primus.plan.thresholds import load_thresholds

    return device_memory_bytes(device), load_thresholds(thresholds)["memory"]["usable_fraction"]


def refuse_if_too_big(model, layout, device: str, thresholds: str | None = None) -> str | None:
    """The heaviest rank does not fit ``device``: a ConfigError; it fits: one line saying by how much;
    no LLM plan (a diffusion model, a model without a known vocabulary): None."""
    from primus.plan.estimate import estimate_memory
    from primus.plan.layout import ParallelLayout
    from primus.plan.model import ModelSpec

    if not isinstance(model, ModelSpec) or not isinstance(layout, ParallelLayout):
        return None
    memory, usable = device_budget(device, thresholds)
    need = estimate_memory(model, layout)
    budget = memory * usable
    parts = ", ".join(f"{name} {value / GIB:.1f}" for name, value in need.components().items() if name != "total")
    where = f"rank {need.rank} (pipeline stage {need.pp_rank})"
    components = need.components()
    state = sum(components.get(name, 0) for name in STATE)
    if state > budget:
        raise ConfigError(f"{where} needs {need.total / GIB:.1f} GiB ({parts}) but {device} has "
                          f"{budget / GIB:.1f} GiB usable ({usable:.0%} of {memory / GIB:.0f} GiB): change the "
                          "layout (primus plan shows the parts), or --force to launch anyway")
    if need.total > budget:  # the activations' share is an upper bound on a GPU: said, not refused
        return (f"memory: {where} may not fit: {need.total / GIB:.1f} GiB ({parts}) of {budget / GIB:.1f} GiB "
                f"usable on {device}; its weights, grads and optimizer fit, and the activations are the PyTorch-"
                "kernel estimate (Transformer Engine, FP8 and fused attention keep less): watch the first steps")
    return f"memory: {where} needs {need.total / GIB:.1f} GiB of {budget / GIB:.1f} GiB usable on {device}"


def fake_world(plan: EnginePlan, world: int, as_rows: bool = False):
    """Build each pipeline stage's first rank with the engine, on the meta device, for ``world`` ranks: the
    table ``plan --build`` prints, or (``as_rows``) one dict per stage."""
    from dataclasses import asdict

    from primus.plan.fakeworld import check_world, format_checks

    framework = plan.module.framework
    if framework not in FAKE_WORLD_ENGINES:
        raise ConfigError(f"a fake-world build is available for {', '.join(FAKE_WORLD_ENGINES)}, not {framework}")
    if plan.model is None or plan.layout is None:
        raise ConfigError("a fake-world build needs the model's description (an LLM with its vocab_size known)")
    build = importlib.import_module(f"primus.backends.{framework}.fakeworld").rank_state
    start = time.perf_counter()
    checks = check_world(build, plan.engine_config, plan.model, plan.layout, world)
    if as_rows:
        return [{**asdict(check), "total": check.total, "agrees": check.agrees} for check in checks]
    return format_checks(checks, FAKE_WORLD_ENGINES[framework], world, time.perf_counter() - start)
