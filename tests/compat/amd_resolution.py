"""Primus's resolved Megatron arguments for an AMD Primus example, in the keys of tests/compat/amd_resolved.json."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

TABLE = Path(__file__).with_name("amd_resolved.json")
DEVICE_IN_PATH = re.compile(r"(?:^|/)(MI3\d\d)X?(?:/|$)")  # the device a file is written for: its folder


def device_of(path: Path) -> str:
    """``MI355X`` in the path -> ``mi355x`` (AMD Primus resolves the same on each; its newest otherwise)."""
    match = DEVICE_IN_PATH.search(path.as_posix())
    return f"{match.group(1).lower()}x" if match else "mi355x"


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
    target = target_for(device_of(path))  # AMD's GPU, never this host's CPU (whose bf16 units come and go)
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
