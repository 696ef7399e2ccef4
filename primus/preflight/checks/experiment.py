"""The experiment against the world: layout divides it, and the estimate fits each rank's memory."""
from __future__ import annotations

from typing import Any

from primus.plan.model import ModelSpec
from primus.preflight.checks import Context
from primus.plan.estimate import GIB, make_plan
from primus.preflight.findings import Finding, fail, info, worst
from primus.plan.diffusion import DiffusionLayout, WanSpec, check_wan_layout, make_wan_plan
from primus.plan.layout import ParallelLayout, check_layout


def collect(options: dict[str, Any]) -> dict[str, Any]:
    return {}


def experiment_payload(model, layout) -> dict[str, Any]:
    """What the launcher hands the workers: an LLM (ModelSpec) or a Wan diffusion transformer."""
    if isinstance(model, WanSpec):
        return {"kind": "wan", "model": model.to_dict(), "layout": layout.to_dict()}
    return {"kind": "llm", "model": model.model_dump(), "layout": layout.to_dict()}


def experiment_objects(options: dict[str, Any]):
    exp = options.get("experiment")
    if not exp:
        return None
    if exp.get("kind") == "wan":
        return WanSpec.from_dict(exp["model"]), DiffusionLayout.from_dict(exp["layout"])
    return ModelSpec(**exp["model"]), ParallelLayout.from_dict(exp["layout"])


def evaluate(ranks: dict[int, dict[str, Any]], ctx: Context) -> list[Finding]:
    objects = experiment_objects(ctx.options)
    if objects is None:
        return [info("experiment", "no experiment given: layout and memory checks skipped")]
    model, layout = objects
    wan = isinstance(model, WanSpec)
    issues = check_wan_layout(model, layout, ctx.world_size) if wan else check_layout(model, layout, ctx.world_size)
    found = [Finding("experiment", issue.level, issue.message, dict(issue.details)) for issue in issues]
    if worst(found) == "fail":
        return found
    memories = [f["accelerators"]["memory_total"] for f in ranks.values() if f.get("accelerators", {}).get("available")]
    usable = ctx.thresholds["memory"]["usable_fraction"]
    device_memory = min(memories) if memories else None
    if wan:
        plan = make_wan_plan(model, layout, device_memory=device_memory, usable_fraction=usable)
        found.append(info("experiment", f"{model.total_params():,} parameters per expert, "
                          f"{layout.clip.tokens(model):,} tokens/sample, {plan.flops_per_sample:.3g} FLOPs/sample, "
                          f"{plan.flops_per_step:.3g} FLOPs/step", plan=plan.to_dict()))
    else:
        plan = make_plan(model, layout, device_memory=device_memory, usable_fraction=usable)
        found.append(info("experiment", f"{plan.params.total:,} parameters ({plan.params.per_rank:,} per rank), "
                          f"{plan.flops.per_token:.3g} FLOPs/token, {plan.flops.per_step:.3g} FLOPs/step",
                          plan=plan.to_dict()))
    need = plan.memory.total
    if plan.device_memory is None:
        found.append(info("experiment", f"estimated {need / GIB:.1f} GiB per rank; no accelerator memory to compare "
                          "(use 'primus plan --device NAME')"))
    elif not plan.fits:
        hint = "activation checkpointing or more ranks" if wan else "recompute, more tp/pp, or sharding"
        found.append(fail("experiment", f"estimated {need / GIB:.1f} GiB per rank exceeds {usable:.0%} of "
                          f"{plan.device_memory / GIB:.0f} GiB device memory; try {hint}",
                          components=plan.memory.components()))
    else:
        found.append(info("experiment", f"estimated {need / GIB:.1f} GiB per rank fits in {usable:.0%} of "
                          f"{plan.device_memory / GIB:.0f} GiB", components=plan.memory.components()))
    return found
