"""The experiment against the world: layout divides it, and the estimate fits each rank's memory."""
from __future__ import annotations

from typing import Any

from primus.plan.estimate import GIB
from primus.plan.sizing import from_payload
from primus.preflight.checks import Context
from primus.preflight.findings import Finding, fail, info, worst


def collect(options: dict[str, Any]) -> dict[str, Any]:
    return {}


def experiment_payload(sizing, model, layout) -> dict[str, Any]:
    """What the launcher hands the workers: the network's kind, shapes and layout (``Sizing.payload``)."""
    return sizing.payload(model, layout)


def experiment_objects(options: dict[str, Any]):
    """(sizing, model, layout) of the experiment handed to the workers, or None without one."""
    exp = options.get("experiment")
    return from_payload(exp) if exp else None


def evaluate(ranks: dict[int, dict[str, Any]], ctx: Context) -> list[Finding]:
    objects = experiment_objects(ctx.options)
    if objects is None:
        return [info("experiment", "no experiment given: layout and memory checks skipped")]
    sizing, model, layout = objects
    found = [Finding("experiment", issue.level, issue.message, dict(issue.details))
             for issue in sizing.problems(model, layout, ctx.world_size)]
    if worst(found) == "fail":
        return found
    memories = [f["accelerators"]["memory_total"] for f in ranks.values() if f.get("accelerators", {}).get("available")]
    usable = ctx.thresholds["memory"]["usable_fraction"]
    device_memory = min(memories) if memories else None
    plan = sizing.estimate(model, layout, device_memory=device_memory, usable_fraction=usable)
    found.append(info("experiment", sizing.summary(model, layout, plan), plan=plan.to_dict()))
    need = plan.memory.total
    if plan.device_memory is None:
        found.append(info("experiment", f"estimated {need / GIB:.1f} GiB per rank; no accelerator memory to compare "
                          "(use 'primus plan --device NAME')"))
    elif not plan.fits:
        found.append(fail("experiment", f"estimated {need / GIB:.1f} GiB per rank exceeds {usable:.0%} of "
                          f"{plan.device_memory / GIB:.0f} GiB device memory; try {sizing.hint}",
                          components=plan.memory.components()))
    else:
        found.append(info("experiment", f"estimated {need / GIB:.1f} GiB per rank fits in {usable:.0%} of "
                          f"{plan.device_memory / GIB:.0f} GiB", components=plan.memory.components()))
    return found
