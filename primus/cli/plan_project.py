"""``primus plan --project`` and ``--search``: load an experiment once, hand it to ``primus.plan``.

The engine knowledge (which settings mean fp8, interleaving, recompute; how a layout is written as
overrides; whether the engine accepts a layout) comes from the backend's ``projection`` module and
its own ``plan``; ``primus.plan.projection`` and ``primus.plan.search`` stay engine-free.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, replace
from typing import Any

from primus.backends.projection import backend_projection, projection_options
from primus.config.errors import ConfigError


@dataclass
class Loaded:
    framework: str
    module: Any  # ResolvedModule
    adapter: Any
    model: Any
    layout: Any
    options: Any  # ProjectionOptions
    target: Any = None  # primus.plan.target.Target the plan is for


def load(path: str, overrides: list[str], module_name: str | None, world: int | None, *, gpu: bool,
         device: str) -> Loaded:
    """The experiment planned for ``device`` (``local``: this host): a named GPU's dtypes, never this host's
    CPU's (the CPU bf16 rule is for runs on a CPU; ``primus.runtime.admission``)."""
    from primus.config.resolve import resolve_experiment
    from primus.launch.job import plan_module, select_module
    from primus.plan.target import target_for
    from primus.runtime.registry import backend_defaults, backend_derived

    resolved = resolve_experiment(path, overrides, backend_defaults, backend_derived)
    module = select_module(resolved, module_name)
    backend_projection(module.framework)
    target = target_for(None if device.lower() == "local" else device)
    adapter, engine_plan = plan_module(resolved, module, world, require_engine=False, target=target)
    if engine_plan.model is None or engine_plan.layout is None:
        raise ConfigError(f"{path}: modules.{module.name}: no model description to project (vocab_size unknown)")
    return Loaded(module.framework, module, adapter, engine_plan.model, engine_plan.layout,
                  projection_options(module.framework, engine_plan, gpu=gpu,
                                     translations=getattr(module, "translations", ())), target)


def profile_for(device: str, ranks_per_node: int):
    """The profile ``--device`` names; a measured CPU profile is split among the ranks of a node."""
    from primus.plan.profiles import get_profile

    profile = get_profile(device)
    return profile.for_ranks_per_node(ranks_per_node)


def project_text(loaded: Loaded, profile, as_json: bool) -> str:
    from primus.plan.projection import project

    projection = project(loaded.model, loaded.layout, profile, loaded.options)
    if as_json:
        return json.dumps({"projected": projection.to_dict()}, indent=2)
    b = projection.breakdown
    lines = [f"projection on {profile.name} ({projection.world_size} ranks, {projection.microbatches} micro-batch(es) "
             "per step), seconds per step:"]
    for key in ("compute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "bubble", "optimizer"):
        if b[key] or key == "compute":
            lines.append(f"  {key:<12}{b[key]:10.4f}" + (
                f"  (GEMM {b['gemm']:.4f}, attention {b['attention']:.4f}, elementwise {b['elementwise']:.4f})"
                if key == "compute" else "  exposed" if key.endswith("_comm") else ""))
    lines.append("  assumptions: " + "; ".join(projection.assumptions))
    lines.append(projection.line())
    return "\n".join(lines)


# --- search -----------------------------------------------------------------------------------------

def set_dotted(params: dict[str, Any], key: str, value: Any) -> None:
    node = params
    *parents, last = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def engine_check(loaded: Loaded, overrides: list[str], world: int) -> str | None:
    """None when the engine's own planning accepts the layout overrides on ``world`` ranks and admission
    admits it on the target (context parallelism needs a GPU), else why not."""
    import yaml

    from primus.runtime.adapter import ModuleConfig

    params = copy.deepcopy(loaded.module.params)
    for item in overrides:
        key, _, text = item.partition("=")
        set_dotted(params, key, yaml.safe_load(text))
    module = ModuleConfig(name=loaded.module.name, framework=loaded.framework,
                          stage=loaded.adapter.canonical_stage(loaded.module.stage), params=params)
    try:
        plan = loaded.adapter.plan(module, world, device=loaded.target.torch_device if loaded.target else "cpu")
        if loaded.target is not None:
            from primus.runtime.admission import admit

            admit(loaded.adapter, plan, loaded.target, getattr(loaded.module, "translations", ())).check()
    except ConfigError as exc:
        return str(exc)
    return None


def search_layouts(loaded: Loaded, profile, *, nodes: int, gpus_per_node: int, top: int):
    """The ranked layouts (``primus.plan.search.SearchResult``), each checked by the engine's own planning."""
    from primus.plan.search import search

    backend = backend_projection(loaded.framework)
    profile = replace(profile, gpus_per_node=gpus_per_node)
    return search(loaded.model, loaded.layout, profile, loaded.options, nodes=nodes, gpus_per_node=gpus_per_node,
                  top=top, overrides_of=backend.layout_overrides, shardings=backend.SHARDINGS, recomputes=backend.RECOMPUTES,
                  context_parallel=backend.CONTEXT_PARALLEL,
                  engine_check=lambda o: engine_check(loaded, o, nodes * gpus_per_node))

def run(args, overrides: list[str]) -> int:
    """``primus plan EXP --project`` / ``--search [--measure]``: print, exit 0 (or 2 on bad input)."""
    import sys

    from primus.cli.plan import plan_report, world_size_of
    from primus.plan.search import check_world

    if not args.device:
        raise ConfigError("--project/--search need --device (mi300x, mi325x, mi355x, h100, h200, b200, or local: "
                          "this host as `primus preflight` measured it)")
    local = args.device.lower() == "local"
    if args.search:
        nodes = args.nnodes if args.nnodes is not None else 1
        gpus = args.gpus_per_node or args.nproc_per_node or (1 if local else 8)
        check_world(nodes, gpus)
        profile = profile_for(args.device, gpus if local else 1)
        loaded = load(args.exp, overrides, args.module, None, gpu=not _is_cpu(profile), device=args.device)
        result = search_layouts(loaded, profile, nodes=nodes, gpus_per_node=gpus, top=args.top)
        if args.measure:
            from primus.cli.plan_measure import measure_rows

            measure_rows(args.exp, overrides, loaded.framework, result, nodes=nodes, gpus_per_node=gpus,
                         top=args.measure, steps=args.measure_steps)
        text = json.dumps(result.to_dict(), indent=2) if args.json else result.format()
        print(text, file=sys.stdout)
        return 0
    given, source = world_size_of(args.nproc_per_node, args.nnodes)
    per_node = args.nproc_per_node or (given or 1)
    profile = profile_for(args.device, per_node if local else 1)
    loaded = load(args.exp, overrides, args.module, given, gpu=not _is_cpu(profile), device=args.device)
    # one plan: the table `primus plan` prints (its heaviest rank is the projection's mem=), then the projection
    from primus.plan.target import target_for
    from primus.preflight.cli import plan_experiment

    plan, admission = plan_experiment(args.exp, overrides, args.module, given,
                                      target_for(None if local else args.device), admit=True)
    table, code = plan_report(plan, admission, None if local else args.device, args, given, source)
    projected = project_text(loaded, profile, args.json)
    if args.json:
        text = json.dumps({**json.loads(table), **json.loads(projected)}, indent=2)
    else:
        text = table + "\n" + projected
    print(text, file=sys.stdout)
    return code


def _is_cpu(profile) -> bool:
    return bool(profile.gemm_tflops_by_threads)
