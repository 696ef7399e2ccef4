"""Primus's resolved engine settings for an AMD Primus example, in the keys of tests/compat/amd_resolved.json
(Megatron), tests/compat/amd_resolved_torchtitan.json (TorchTitan) and tests/compat/amd_resolved_automodel.json
(NeMo AutoModel)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# AMD Primus's example files: the copies kept here, or a whole checkout (AMD_PRIMUS_CHECKOUT), or its mirror
FIXTURES = ROOT / "tests" / "fixtures" / "amd_primus"
CHECKOUT = os.environ.get("AMD_PRIMUS_CHECKOUT")
AMD_MIRROR = Path(os.environ.get("AMD_PRIMUS_GIT_DIR", "/work/.mirror/AMD-AGI+Primus/repo"))
TABLE = Path(__file__).with_name("amd_resolved.json")
TORCHTITAN_TABLE = Path(__file__).with_name("amd_resolved_torchtitan.json")
AUTOMODEL_TABLE = Path(__file__).with_name("amd_resolved_automodel.json")
# The diffusion YAML keys AutoModel retired, and what 0.7.0 reads instead (its _REMOVED_KEY_MIGRATIONS)
AUTOMODEL_RENAMED = {"optim.learning_rate": "optimizer.lr", "optim.optimizer.": "optimizer."}


def amd_table(path: Path = TABLE) -> dict[str, Any]:
    return json.loads(path.read_text())


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
        if module.framework == "torchtitan":
            values[name] = {key: torchtitan_value(args, module.params, key) for key in keys}
        elif module.framework == "nemo_automodel":
            values[name] = {key: automodel_value(args, key) for key in keys}
        else:
            values[name] = {key: _plain(getattr(args, key, None)) for key in keys}
        lines[name] = lines_for(module, args)
        stages[name] = module.stage
    return values, lines, stages


def torchtitan_value(cfg: Any, params: dict[str, Any], key: str) -> Any:
    """One column of the TorchTitan table, read from TorchTitan 0.3.0's ``Trainer.Config`` (``cfg``): the
    0.2 names of the table (``optimizer.beta1``) from 0.3.0's objects (the catch-all param group)."""
    if key in ("model.name", "model.flavor"):
        return params["model"][key.split(".")[1]]
    if key.startswith("optimizer."):
        group = cfg.optimizer.param_groups[0]
        name = key.split(".")[1]
        if name == "name":
            return group.optimizer_name
        if name in ("beta1", "beta2"):
            return group.optimizer_kwargs["betas"][name == "beta2"]
        return group.optimizer_kwargs[name]
    if key == "data":
        return cfg.dataloader.dataset
    if key == "activation_checkpoint":
        kind = type(cfg.activation_checkpoint).__qualname__.split(".")[0]  # SelectiveAC.Config
        return {"NoneType": "none", "FullAC": "full", "SelectiveAC": "selective(op)",
                "MemoryBudgetAC": "memory_budget"}[kind]
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return _plain(node)


def automodel_value(cfg: dict[str, Any], key: str) -> Any:
    """One column of the AutoModel table, read from the dict Primus hands ``TrainDiffusionRecipe`` as its
    ``ConfigNode`` reads a value (``translate_value``: ``5e-5`` a float; a ``_target_`` left a name): AMD's
    retired names at 0.7.0's, ``wandb`` whether a run starts."""
    from nemo_automodel.components.config.loader import translate_value

    if key == "wandb":
        return cfg.get("wandb") is not None
    for old, new in AUTOMODEL_RENAMED.items():
        if key.startswith(old):
            key = new + key[len(old):]
    node: Any = cfg
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return [translate_value(v) for v in node] if isinstance(node, (list, tuple)) else translate_value(node)


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return getattr(value, "value", value)  # an enum as its YAML spelling


def unexplained(where: str, keys: list[str], row: list, ours: dict[str, Any], lines: list[str],
                announced: dict[str, str], same_run=lambda name, amd, ours: False) -> list[str]:
    """The differences of one module's row (AMD Primus's values) from Primus's: none where the values are
    equal (floats to 1e-12), ``same_run`` says they mean one run, or exactly one ``differs:`` line of
    ``announced`` says so."""
    problems = []
    for name, amd in zip(keys, row):
        value = ours[name]
        if value == amd or same_run(name, amd, value):
            continue
        if isinstance(amd, float) and isinstance(value, float) and abs(amd - value) <= 1e-12 * abs(amd):
            continue
        line = announced.get(name)
        if line and sum(text.startswith(line) for text in lines) == 1:
            continue
        problems.append(f"{where}: {name}: AMD Primus {amd!r}, here {value!r}{' (no differs: line)' if line else ''}")
    return problems
