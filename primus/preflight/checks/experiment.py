"""The experiment against the world: layout divides it, and the estimate fits each rank's memory."""
from __future__ import annotations

from typing import Any

from primus.plan.model import ModelSpec
from primus.preflight.checks import Context
from primus.plan.estimate import GIB, make_plan
from primus.preflight.findings import Finding, fail, info, worst
from primus.plan.layout import ParallelLayout, check_layout


def collect(options: dict[str, Any]) -> dict[str, Any]:
    return {}


def experiment_objects(options: dict[str, Any]) -> tuple[ModelSpec, ParallelLayout] | None:
    exp = options.get("experiment")
    if not exp:
        return None
    return ModelSpec(**exp["model"]), ParallelLayout.from_dict(exp["layout"])


def evaluate(ranks: dict[int, dict[str, Any]], ctx: Context) -> list[Finding]:
    objects = experiment_objects(ctx.options)
    if objects is None:
        return [info("experiment", "no experiment given: layout and memory checks skipped")]
    model, layout = objects
    found = [Finding("experiment", issue.level, issue.message, dict(issue.details))
             for issue in check_layout(model, layout, ctx.world_size)]
    if worst(found) == "fail":
        return found
    memories = [f["accelerators"]["memory_total"] for f in ranks.values() if f.get("accelerators", {}).get("available")]
    usable = ctx.thresholds["memory"]["usable_fraction"]
    plan = make_plan(model, layout, device_memory=min(memories) if memories else None, usable_fraction=usable)
    found.append(info("experiment", f"{plan.params.total:,} parameters ({plan.params.per_rank:,} per rank), "
                      f"{plan.flops.per_token:.3g} FLOPs/token, {plan.flops.per_step:.3g} FLOPs/step",
                      plan=plan.to_dict()))
    need = plan.memory.total
    if plan.device_memory is None:
        found.append(info("experiment", f"estimated {need / GIB:.1f} GiB per rank; no accelerator memory to compare "
                          "(use 'primus plan --device NAME')"))
    elif not plan.fits:
        found.append(fail("experiment", f"estimated {need / GIB:.1f} GiB per rank exceeds {usable:.0%} of "
                          f"{plan.device_memory / GIB:.0f} GiB device memory; try recompute, more tp/pp, or sharding",
                          components=plan.memory.components()))
    else:
        found.append(info("experiment", f"estimated {need / GIB:.1f} GiB per rank fits in {usable:.0%} of "
                          f"{plan.device_memory / GIB:.0f} GiB", components=plan.memory.components()))
    return found
