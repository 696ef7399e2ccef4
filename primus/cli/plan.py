"""``primus plan EXP``: parameters, FLOPs and per-rank memory of an experiment, no cluster needed.

Exit status: 0 fits; 1 does not fit or the layout is wrong; 2 a user error (unknown device, bad YAML).
No torch import here: ``primus --help`` stays fast.
"""
from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    plan = subparsers.add_parser(
        "plan", allow_abbrev=False, help="parameters, FLOPs and per-rank memory of an experiment",
        description="Estimate an experiment without a cluster: parameters, FLOPs per token and step, memory "
                    "per rank by component, and whether it fits --device. Exit 0 fits, 1 does not fit or "
                    "the layout is wrong, 2 user error.")
    plan.add_argument("exp", help="experiment YAML")
    plan.add_argument("--device", help="device to fit: " + ", ".join(_device_names()))
    plan.add_argument("--module", help="module of EXP (default: pre_trainer)")
    plan.add_argument("--thresholds", help="YAML overriding primus/preflight/thresholds.yaml")
    plan.add_argument("--json", action="store_true", help="print the estimate as JSON")
    plan.set_defaults(handler=_plan, accepts_overrides=True)


def _device_names() -> list[str]:
    from primus.plan.devices import DEVICE_MEMORY_GIB  # not estimate: --help must not import pydantic

    return sorted(DEVICE_MEMORY_GIB)


def run_plan(model, layout, device: str | None, thresholds_path: str | None = None, as_json: bool = False) -> tuple[str, int]:
    """The text (or JSON) ``primus plan`` prints and its exit status."""
    from primus.plan.estimate import format_plan, make_plan
    from primus.plan.layout import check_layout, worst_level
    from primus.preflight.thresholds import load_thresholds

    thresholds = load_thresholds(thresholds_path)
    problems = check_layout(model, layout)
    if worst_level(problems) == "fail":
        lines = [f"{p.level}: {p.message}" for p in problems]
        return ("\n".join(lines) if not as_json else json.dumps({"problems": [p.to_dict() for p in problems]}, indent=2)), 1
    plan = make_plan(model, layout, device, usable_fraction=thresholds["memory"]["usable_fraction"])
    code = 1 if plan.fits is False else 0
    if as_json:
        return json.dumps({**plan.to_dict(), "problems": [p.to_dict() for p in problems]}, indent=2), code
    text = format_plan(plan)
    if problems:
        text += "\n" + "\n".join(f"{p.level}: {p.message}" for p in problems)
    return text, code


def _plan(args: argparse.Namespace, overrides: list[str]) -> int:
    from primus.preflight.cli import load_experiment

    import os

    env = os.environ  # the launcher's world: WORLD_SIZE, else GPUS_PER_NODE x NNODES
    world = int(env.get("WORLD_SIZE") or int(env.get("GPUS_PER_NODE", "1")) * int(env.get("NNODES", "1")))
    model, layout = load_experiment(args.exp, overrides, args.module, world)
    text, code = run_plan(model, layout, args.device, args.thresholds, args.json)
    print(text, file=sys.stdout)
    return code
