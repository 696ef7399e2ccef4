"""``primus config show|validate EXP [overrides]``: resolve without launching anything."""
from __future__ import annotations

import argparse

import yaml


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("config", help="show or validate a resolved experiment")
    actions = parser.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    show = actions.add_parser("show", allow_abbrev=False, help="print the resolved config (secrets redacted)")
    show.add_argument("exp")
    show.add_argument("--why", metavar="KEY", help="print the chain of sources that set KEY")
    show.set_defaults(handler=_show, accepts_overrides=True)
    validate = actions.add_parser("validate", allow_abbrev=False,
                                  help="strictly validate, including against the engine's own config")
    validate.add_argument("exp")
    validate.add_argument("--no-engine", action="store_true", help="skip the engine-level checks")
    validate.add_argument("--check-paths", action="store_true", help="also require data/tokenizer paths to exist")
    validate.add_argument("--device", metavar="NAME", help="admit the run for this device (mi300x, mi355x, h100 ...; "
                                                           "default: this host's)")
    validate.set_defaults(handler=_validate, accepts_overrides=True)


def _resolve(args: argparse.Namespace, overrides: list[str]):
    from primus.config.resolve import resolve_experiment
    from primus.runtime.registry import backend_defaults, backend_derived

    return resolve_experiment(args.exp, overrides, backend_defaults, backend_derived)


def _show(args: argparse.Namespace, overrides: list[str]) -> int:
    from primus.config.resolve import format_why

    resolved = _resolve(args, overrides)
    if args.why:
        print(format_why(resolved, args.why))
    else:
        print(yaml.safe_dump(resolved.redacted_tree(), sort_keys=False), end="")
    return 0


def _validate(args: argparse.Namespace, overrides: list[str]) -> int:
    from primus.launch.job import admit_module, plan_module, validate_keys
    from primus.plan.target import target_for

    target = target_for(args.device)  # an unknown device is a user error before any parsing
    resolved = _resolve(args, overrides)
    lines = []
    for module in resolved.modules.values():
        if args.no_engine:  # every key against the backend's own tables, without importing the engine
            planned, plan = validate_keys(resolved, module, target), None
            admission = admit_module(resolved, module, *planned, target) if planned else None
            lines.append(f"OK {args.exp}: modules.{module.name} ({module.framework}, "
                         f"{'keys checked, engine not imported' if planned else 'schema only'})")
        else:
            adapter, plan = plan_module(resolved, module, check_paths=args.check_paths, target=target)
            admission = admit_module(resolved, module, adapter, plan, target)
            lines.append(f"OK {args.exp}: modules.{module.name} ({module.framework} {adapter.installed_version()})")
        if admission is not None:
            lines.append(f"  {admission.summary()}")
        lines += [f"  {translation.line()}" for translation in module.translations]  # AMD Primus names, differs:
        if plan is not None:
            from primus.compat.differs import engine_lines

            lines += [f"  {text}" for text in engine_lines(module, plan.engine_config)]
    print("\n".join(lines))
    return 0
