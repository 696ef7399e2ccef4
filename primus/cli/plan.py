"""``primus plan EXP``: parameters, FLOPs and per-rank memory of an experiment, no cluster needed.

LLMs (TorchTitan, Megatron) through ``primus.plan.estimate``; Wan video diffusion (AutoModel)
through ``primus.plan.diffusion``. The first line says the world size and the device the plan
assumes, and where each came from; the second whether the launch is admitted on that device
(``primus.runtime.admission``; the plan's dtypes are that device's, never this host's CPU's). Exit
status: 0 fits; 1 does not fit, the layout is wrong or the launch would be refused; 2 a user error
(unknown device, bad YAML). No torch import here: ``primus --help`` stays fast.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from primus.config.errors import ConfigError
from primus.config.values import count_flag, env_count, non_empty_flag


def register(subparsers: argparse._SubParsersAction) -> None:
    plan = subparsers.add_parser(
        "plan", allow_abbrev=False, help="parameters, FLOPs and per-rank memory of an experiment",
        description="Estimate an experiment without a cluster: parameters, FLOPs per token/sample and step, memory "
                    "per rank by component, whether it fits --device and whether a launch there is admitted. Exit 0 "
                    "fits, 1 does not fit, the layout is wrong or the launch would be refused, 2 user error.")
    plan.add_argument("exp", help="experiment YAML")
    plan.add_argument("--device", type=non_empty_flag, help="device to fit: " + ", ".join(_device_names()))
    plan.add_argument("--nproc-per-node", type=count_flag(1), help="processes per node (env GPUS_PER_NODE, default 1)")
    plan.add_argument("-N", "--nnodes", "--nodes", dest="nnodes", type=count_flag(1),
                      help="nodes (env NNODES, default 1)")
    plan.add_argument("--module", help="module of EXP (default: pre_trainer)")
    plan.add_argument("--thresholds", help="YAML overriding primus/preflight/thresholds.yaml")
    plan.add_argument("--json", action="store_true", help="print the estimate as JSON")
    plan.add_argument("--project", action="store_true",
                      help="project step time, tokens/s/GPU and MFU on --device, with the breakdown")
    plan.add_argument("--search", action="store_true",
                      help="rank legal layouts on --nodes x --gpus-per-node --device by projected tokens/s/GPU")
    plan.add_argument("--gpus-per-node", type=int, help="devices per node for --search (default --nproc-per-node, 8)")
    plan.add_argument("--top", type=int, default=10, help="layouts --search shows (default 10)")
    plan.add_argument("--measure", type=int, nargs="?", const=3, default=0, metavar="K",
                      help="--search: run the top K (default 3) for a few steps here and re-rank by measurement")
    plan.add_argument("--measure-steps", type=int, default=6, help="steps per measured layout (default 6)")
    plan.add_argument("--build", action="store_true",
                      help="also build each pipeline stage's real model with the engine, on the meta device with a "
                           "fake process group for the whole world: the engine's own layout errors and per-rank "
                           "bytes (Megatron, TorchTitan; seconds on a CPU)")
    plan.set_defaults(handler=_plan, accepts_overrides=True)


def _device_names() -> list[str]:
    from primus.plan.devices import DEVICE_MEMORY_GIB  # not estimate: --help must not import pydantic

    return sorted(DEVICE_MEMORY_GIB) + ["local (--project/--search: measured by primus preflight)"]


def world_size_of(nproc_per_node: int | None, nnodes: int | None, env=os.environ) -> tuple[int | None, str]:
    """(world size, where it came from): flags, then GPUS_PER_NODE/NNODES; None when neither says.
    A count below 1 or not a number, from a flag or a variable, is a user error naming it."""
    parts, sources = [], []
    for flag, value, var in (("--nproc-per-node", nproc_per_node, "GPUS_PER_NODE"), ("-N", nnodes, "NNODES")):
        from_env = env_count(var, env) if value is None else None
        if value is not None:
            parts.append(value)
            sources.append(f"{flag} {value}")
        elif from_env is not None:
            parts.append(from_env)
            sources.append(f"${var}={from_env}")
        else:
            parts.append(1)
    from primus.plan.search import MAX_NODES

    if parts[1] > MAX_NODES:
        raise ConfigError(f"{sources[-1]}: more than {MAX_NODES:,} nodes is not a cluster to plan for")
    if not sources:
        world = env_count("WORLD_SIZE", env)
        if world is not None:
            return world, f"$WORLD_SIZE={world}"
        return None, "not given (--nproc-per-node, -N): the smallest world the experiment's layout runs on"
    return parts[0] * parts[1], f"{parts[0]} per node x {parts[1]} node(s) from {', '.join(sources)}"


def _assumptions(world: int, source: str, device: str | None, admission) -> str:
    shown = f"device {device} (--device)" if device else "no device (--device NAME to check that it fits)"
    admitted = admission.summary() if admission.ok else f"NOT admitted on {admission.target.name}: {admission.error()}"
    return f"plan for world size {world} ({source}), {shown}\n{admitted}"


def run_plan(model, layout, device: str | None, thresholds_path: str | None = None, as_json: bool = False,
             world_size: int | None = None) -> tuple[str, int]:
    """The text (or JSON) ``primus plan`` prints and its exit status (the assumptions line not included)."""
    from primus.plan.diffusion import WanSpec
    from primus.plan.layout import worst_level
    from primus.preflight.thresholds import load_thresholds

    usable = load_thresholds(thresholds_path)["memory"]["usable_fraction"]
    if isinstance(model, WanSpec):
        from primus.plan.diffusion import check_wan_layout, format_wan_plan, make_wan_plan

        problems, make, fmt = check_wan_layout(model, layout, world_size), make_wan_plan, format_wan_plan
    else:
        from primus.plan.estimate import format_plan, make_plan
        from primus.plan.layout import check_layout

        problems, make, fmt = check_layout(model, layout, world_size), make_plan, format_plan
    if worst_level(problems) == "fail":
        lines = [f"{p.level}: {p.message}" for p in problems]
        return ("\n".join(lines) if not as_json else json.dumps({"problems": [p.to_dict() for p in problems]}, indent=2)), 1
    plan = make(model, layout, device, usable_fraction=usable)
    if device and not isinstance(model, WanSpec):  # asked whether it fits: fitting no device is bad input
        from primus.plan.estimate import fits_nowhere

        if (reason := fits_nowhere(plan.memory, usable)) is not None:
            raise ConfigError(reason)
    code = 1 if plan.fits is False else 0
    if as_json:
        return json.dumps({**plan.to_dict(), "problems": [p.to_dict() for p in problems]}, indent=2), code
    text = fmt(plan)
    if problems:
        text += "\n" + "\n".join(f"{p.level}: {p.message}" for p in problems)
    return text, code


def plan_report(plan, admission, device: str | None, args: argparse.Namespace, given: int | None,
                source: str) -> tuple[str, int]:
    """What ``primus plan`` prints for an ``EnginePlan`` and its admission (the assumptions and admission
    lines, the vocabulary where derived, then the table; or the JSON) and its exit status; ``--project``
    prints the same before its projection."""
    world = given or plan.layout.world_size
    text, code = run_plan(plan.model, plan.layout, device, args.thresholds, args.json, world_size=given)
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


def _plan(args: argparse.Namespace, overrides: list[str]) -> int:
    if args.project or args.search:
        from primus.cli.plan_project import run

        return run(args, overrides)
    from primus.preflight.cli import plan_experiment
    from primus.plan.target import target_for

    if args.device:
        from primus.plan.estimate import device_memory_bytes

        device_memory_bytes(args.device)  # an unknown device is a user error before any parsing
    target = target_for(args.device)  # the plan's dtypes are the target's, never this host's CPU's
    given, source = world_size_of(args.nproc_per_node, args.nnodes)
    plan, admission = plan_experiment(args.exp, overrides, args.module, given, target, admit=True,
                                      say=lambda text: print(text, file=sys.stderr))  # stdout may be --json
    text, code = plan_report(plan, admission, args.device, args, given, source)
    if args.build and (code == 0 or "fail:" not in text):  # a layout the plan already refuses is not built
        text, code = _with_fake_world(args, overrides, given or plan.layout.world_size, text, code)
    print(text, file=sys.stdout)
    return code


def _with_fake_world(args: argparse.Namespace, overrides: list[str], world: int, text: str,
                     code: int) -> tuple[str, int]:
    built, build_code = _fake_world(args, overrides, world)
    if args.json:
        data = json.loads(text)
        data["fake_world"] = built
        return json.dumps(data, indent=2), max(code, build_code)
    return text + "\n" + built, max(code, build_code)


def _fake_world(args: argparse.Namespace, overrides: list[str], world: int) -> tuple[Any, int]:
    """``--build``: the engine's own model per pipeline stage (primus.launch.memory_check.fake_world): its
    table (or, with --json, its rows), or the engine's refusal as a ``fail:`` line."""
    from primus.config.resolve import resolve_experiment
    from primus.launch.job import plan_module, select_module
    from primus.launch.memory_check import fake_world
    from primus.runtime.registry import backend_defaults, backend_derived

    resolved = resolve_experiment(args.exp, overrides, backend_defaults, backend_derived)
    from primus.plan.target import target_for

    _, engine_plan = plan_module(resolved, select_module(resolved, args.module), world, target=target_for(args.device))
    try:
        return fake_world(engine_plan, world, as_rows=args.json), 0
    except ConfigError as refused:  # the engine rejects the layout at this scale: the layout is wrong
        return ({"fail": str(refused)} if args.json else f"fail: {refused}"), 1
