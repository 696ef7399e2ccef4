"""Primus's resolved Megatron arguments for an AMD Primus example, in the keys of tests/compat/amd_resolved.json."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TABLE = Path(__file__).with_name("amd_resolved.json")


def amd_table() -> dict[str, Any]:
    return json.loads(TABLE.read_text())


def primus_arguments(path: Path, keys: list[str]) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]],
                                                           dict[str, str]]:
    """({module: {key: value Primus runs}}, {module: its differs: lines}, {module: stage}) for one file."""
    from primus.compat.differs import lines_for
    from primus.launch.experiment import resolve
    from primus.launch.job import plan_module
    from primus.plan.target import target_for

    resolved = resolve(path, [])
    from tests.helpers import load_tool

    # the device in the file's folder, as the compatibility report admits it; never this host's CPU
    target = target_for(load_tool("primus_compat").device_of(path.as_posix()))
    values, lines, stages = {}, {}, {}
    for name, module in resolved.modules.items():
        _, plan = plan_module(resolved, module, None, require_engine=False, target=target)
        args = plan.engine_config
        values[name] = {key: _plain(getattr(args, key, None)) for key in keys}
        lines[name] = lines_for(module, args)
        stages[name] = module.stage
    return values, lines, stages


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return getattr(value, "value", value)  # an enum as its YAML spelling
