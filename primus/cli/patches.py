"""``primus patches [EXP] [--device NAME]``: which engine-compatibility patches a run would apply, and why.

Each engine's records (``primus.backends.<engine>.patches``) are evaluated here, nothing is applied:
for this host, or for a named GPU (``--device h100``: a CUDA/ROCm device, with its standard image's
software assumed). With EXP, only its engine, and what its run uses (a float8 model, an LLM recipe)
is known; without, a patch that depends on the run says so.
"""
from __future__ import annotations

import argparse
import importlib

from primus.config.values import non_empty_flag


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "patches", allow_abbrev=False, help="which engine-compatibility patches apply here, and why",
        description="List each engine's compatibility patches: those a run would apply on this host (or on "
                    "--device) with the condition that holds, and those it would not, with the reason. With EXP "
                    "(and key=value overrides): only its engine, for what its run uses.")
    parser.add_argument("exp", nargs="?", help="experiment YAML (default: every installed engine)")
    parser.add_argument("--device", type=non_empty_flag,
                        help="a device that may not be here: cpu, or a GPU (h100, h200, b200, mi300x, mi355x, ...)")
    parser.add_argument("--module", help="module of EXP (default: pre_trainer)")
    parser.set_defaults(handler=_patches, accepts_overrides=True)


def _patches(args: argparse.Namespace, overrides: list[str]) -> int:
    from primus.config.errors import ConfigError

    where = _where(args.device)
    engines = _engines()
    if args.exp:
        from primus.launch.experiment import resolve
        from primus.launch.job import select_module

        module = select_module(resolve(args.exp, overrides), args.module)
        if module.framework not in engines:
            raise ConfigError(f"{args.exp}: backend '{module.framework}' lists no patches")
        records = importlib.import_module(engines[module.framework])
        engines = {module.framework: engines[module.framework]}
        from primus.runtime.registry import get_adapter

        recipe = get_adapter(module.framework).recipe(module.stage, module.params)
        where = _replace_uses(where, records.params_uses(module.params) | recipe.patch_uses)
    print(f"patches for {_describe(where, args.device)}")
    for engine, path in engines.items():
        print(render(engine, importlib.import_module(path).PATCHES, where))
    return 0


def _engines() -> dict[str, str]:
    from primus.runtime.registry import adapter_classes

    return {cls.name: cls.patches for cls in adapter_classes() if cls.patches}


def _where(device: str | None):
    from primus.runtime.patches import Where

    if device is not None and device.strip().lower() == "cpu":
        return Where(gpu=False)
    from primus.plan.target import target_for

    target = target_for(device)  # an unknown name is a user error naming the known ones
    return Where(target.gpu, target.name, assumed=target.assumed)


def _replace_uses(where, uses: frozenset[str]):
    import dataclasses

    return dataclasses.replace(where, uses=uses)


def _describe(where, device: str | None) -> str:
    if device is None:
        return f"this host ({'a CPU' if not where.gpu else where.device})"
    return f"{where.device}" + (" (not here: its standard CUDA/ROCm image assumed; other packages as installed here)"
                                 if where.assumed else "")


def render(engine: str, patches: list, where) -> str:
    """One engine's block: what applies (and the condition that holds), then what does not (and why not)."""
    verdicts = [(patch, *patch.verdict(where)) for patch in patches]
    lines = [f"{engine}:"]
    for title, wanted in (("applies", True), ("does not apply", False)):
        chosen = [(patch, reason) for patch, ok, reason in verdicts if ok is wanted]
        lines.append(f"  {title} ({len(chosen)}):")
        lines += [f"    {patch.name}: {patch.why}\n      [{reason}]" for patch, reason in chosen] or ["    -"]
    return "\n".join(lines)
