"""What ``primus plan`` prints for a plan: the assumptions and admission lines, the vocabulary where
derived, the memory table (or JSON), and its exit status. ``plan --project`` prints the same first."""
from __future__ import annotations

import argparse
import json

from primus.config.errors import ConfigError


def _assumptions(world: int, source: str, device: str | None, admission) -> str:
    shown = f"device {device} (--device)" if device else "no device (--device NAME to check that it fits)"
    admitted = admission.summary() if admission.ok else f"NOT admitted on {admission.target.name}: {admission.error()}"
    return f"plan for world size {world} ({source}), {shown}\n{admitted}"


def run_plan(model, layout, device: str | None, thresholds_path: str | None = None, as_json: bool = False,
             world_size: int | None = None, sizing=None) -> tuple[str, int]:
    """The text (or JSON) ``primus plan`` prints and its exit status (the assumptions line not included).
    ``sizing``: the plan's (``primus.plan.sizing``; default an LLM's)."""
    from primus.plan.layout import worst_level
    from primus.plan.sizing import LLM
    from primus.plan.thresholds import load_thresholds

    sizing = sizing or LLM
    usable = load_thresholds(thresholds_path)["memory"]["usable_fraction"]
    problems = sizing.problems(model, layout, world_size)
    if worst_level(problems) == "fail":
        lines = [f"{p.level}: {p.message}" for p in problems]
        return ("\n".join(lines) if not as_json else json.dumps({"problems": [p.to_dict() for p in problems]}, indent=2)), 1
    plan = sizing.estimate(model, layout, device, usable_fraction=usable)
    if device and sizing is LLM:  # asked whether it fits: fitting no device is bad input
        from primus.plan.estimate import fits_nowhere

        if (reason := fits_nowhere(plan.memory, usable)) is not None:
            raise ConfigError(reason)
    code = 1 if plan.fits is False else 0
    if as_json:
        return json.dumps({**plan.to_dict(), "problems": [p.to_dict() for p in problems]}, indent=2), code
    text = sizing.format(plan)
    if problems:
        text += "\n" + "\n".join(f"{p.level}: {p.message}" for p in problems)
    return text, code


def plan_report(plan, admission, device: str | None, args: argparse.Namespace, given: int | None,
                source: str) -> tuple[str, int]:
    """What ``primus plan`` prints for an ``EnginePlan`` and its admission (the assumptions and admission
    lines, the vocabulary where derived, then the table; or the JSON) and its exit status; ``--project``
    prints the same before its projection."""
    world = given or plan.layout.world_size
    text, code = run_plan(plan.model, plan.layout, device, args.thresholds, args.json, world_size=given,
                          sizing=plan.sizing)
    if not admission.ok:  # the launch on that device would stop at admission: the plan says so, exit 1
        code = max(code, 1)
    if args.json:
        data = json.loads(text)
        return json.dumps({"world_size": world, "world_size_source": source, "device": device,
                           "admission": {"target": admission.target.to_dict(), "admitted": admission.ok,
                                         "refusals": [r.line(admission.module) for r in admission.refusals]},
                           **data}, indent=2), code
    vocabulary = [f"vocabulary        {d.value} ({d.reason})" for d in plan.derived if d.key == "vocab_size"]
    return "\n".join([_assumptions(world, source, device, admission), *vocabulary, text]), code
