"""Predicted vs measured: the end-of-run line that puts ``primus plan --project`` beside the run.

Each run adds a residual: its median step time (steps after the first two, which compile and warm
up) against the projection for the same layout on this device (the vendor profile of a known
accelerator; on CPU the ``local`` profile ``primus preflight`` measured, if there is one).
"""
from __future__ import annotations

import os
import statistics
from typing import Any

SKIP_STEPS = 2


def projection_line(plan: Any, step_times: list[float], device: str, device_name: str) -> str | None:
    """One line for the run's summary, or None when there is nothing to compare (no model, no steps)."""
    if plan.model is None or plan.layout is None or len(step_times) <= SKIP_STEPS:
        return None
    from primus.backends.projection import PROJECTED, projection_options
    from primus.plan.devices import device_key
    from primus.plan.profiles import LOCAL, PROFILES, get_profile, local_profile_path, read_local_profile
    from primus.plan.projection import project

    framework = plan.module.framework
    if framework not in PROJECTED:
        return None
    gpu = device.startswith("cuda")
    key = device_key(device_name) if gpu else None
    if key in PROFILES:
        profile, name = get_profile(key), key
    elif read_local_profile() is not None:
        ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        profile, name = get_profile(LOCAL).for_ranks_per_node(ranks), LOCAL
    else:
        return (f"projection: no profile for {device_name} (`primus preflight` on this host writes "
                f"{local_profile_path()}); measured median step time {_median(step_times):.3f}s")
    try:
        projected = project(plan.model, plan.layout, profile, projection_options(framework, plan, gpu=gpu))
    except Exception as exc:  # noqa: BLE001 - a projection that cannot be made must not fail a finished run
        return f"projection: not available ({type(exc).__name__}: {exc})"
    measured = _median(step_times)
    error = (projected.step_time - measured) / measured
    measured_by = f"; {profile.sources['measured']}" if name == LOCAL and profile.sources.get("measured") else ""
    return (f"projected vs measured ({name} profile{measured_by}): step_time {projected.step_time:.3f}s vs {measured:.3f}s "
            f"(median of steps {SKIP_STEPS + 1}-{len(step_times)}), error {100 * error:+.1f}%; "
            f"{projected.line()}")


def _median(step_times: list[float]) -> float:
    return statistics.median(step_times[SKIP_STEPS:] or step_times)
