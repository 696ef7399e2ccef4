"""Resolve an experiment file + command line into one validated config, with provenance.

ONE precedence rule, later wins everywhere:

    backend defaults < module preset < model preset < experiment overrides < command line

Command-line keys route by their first segment: experiment keys (``exp_name=...``,
``modules.pre_trainer.framework=...``) change the experiment; anything else
(``training.steps=5`` or ``modules.pre_trainer.training.steps=5``) changes a module's params.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from primus.config.errors import ConfigError
from primus.config.overrides import overrides_layer, parse_overrides
from primus.config.presets import CONFIGS_ROOT, find_preset, load_with_extends
from primus.config.provenance import Provenance, Source, merge_layer
from primus.config.schema import ExperimentSpec, ModuleSpec, validate_model
from primus.config.secrets import redact_tree
from primus.config.yaml_source import Layer

DefaultsFn = Callable[[str, str, str, str], dict[str, Any]]  # (framework, stage, where, where) -> defaults


@dataclass
class ResolvedModule:
    name: str
    framework: str
    stage: str
    config: str | None
    model: str | None
    params: dict[str, Any]


@dataclass
class ResolvedExperiment:
    source: Path
    spec: ExperimentSpec
    modules: dict[str, ResolvedModule]
    provenance: Provenance = field(default_factory=Provenance)

    def tree(self) -> dict[str, Any]:
        """The resolved config as saved to ``config.resolved.yaml`` (before redaction)."""
        head = self.spec.model_dump(exclude={"modules"})
        head["modules"] = {
            name: {"framework": m.framework, "stage": m.stage, "config": m.config, "model": m.model,
                   "params": m.params}
            for name, m in self.modules.items()
        }
        return head

    def redacted_tree(self) -> dict[str, Any]:
        templates = {}
        for key, raw in self.provenance.templates.items():
            # provenance keys for params are modules.<m>.<path>; the saved tree nests them under params
            parts = key.split(".")
            if parts[0] == "modules" and len(parts) > 2 and parts[2] not in ModuleSpec.model_fields:
                key = ".".join([*parts[:2], "params", *parts[2:]])
            templates[key] = raw
        return redact_tree(self.tree(), templates)


_EXPERIMENT_KEYS = set(ExperimentSpec.model_fields)
_MODULE_KEYS = set(ModuleSpec.model_fields)


def _route(items: list[tuple[str, Any, str]], module_names: list[str]):
    """Split command-line overrides into experiment-level ones and per-module param ones."""
    experiment, params = [], {name: [] for name in module_names}
    for key, value, token in items:
        parts = key.split(".")
        if parts[0] == "modules" and len(parts) >= 3:
            name = parts[1]
            if parts[2] in _MODULE_KEYS:
                experiment.append((key, value, token))
            elif name in params:
                params[name].append((".".join(parts[2:]), value, token))
            else:
                raise ConfigError(f"command line '{token}': no module '{name}' (modules: {', '.join(module_names)})")
        elif parts[0] in _EXPERIMENT_KEYS:
            experiment.append((key, value, token))
        elif len(module_names) == 1:
            params[module_names[0]].append((key, value, token))
        else:
            raise ConfigError(f"command line '{token}': several modules; write modules.<name>.{key}")
    return experiment, params


def _overrides_as_layer(name: str, spec: ModuleSpec, provenance: Provenance) -> Layer:
    prefix = f"modules.{name}.overrides"
    origins = {key[len(prefix) + 1:]: chain[-1].where
               for key, chain in provenance.chains.items() if key.startswith(prefix + ".")}
    templates = {key[len(prefix) + 1:]: raw
                 for key, raw in provenance.templates.items() if key.startswith(prefix + ".")}
    return Layer("experiment overrides", spec.overrides, origins, templates)


def _preset_layers(name: str, module: ModuleSpec, experiment_dir: Path, provenance: Provenance) -> list[Layer]:
    layers: list[Layer] = []
    if module.config:
        path = find_preset(module.config, [CONFIGS_ROOT / "modules" / module.framework],
                           relative_to=experiment_dir, what="module preset",
                           where=provenance.describe(f"modules.{name}.config"))
        layers += load_with_extends(path, "module preset")
    if module.model:
        path = find_preset(module.model, [CONFIGS_ROOT / "models" / module.framework, CONFIGS_ROOT / "models" / "common"],
                           relative_to=experiment_dir, what="model preset",
                           where=provenance.describe(f"modules.{name}.model"))
        layers += load_with_extends(path, "model preset")
    return layers


def resolve_experiment(path: str | Path, cli_tokens: list[str] | None = None,
                       backend_defaults: DefaultsFn | None = None) -> ResolvedExperiment:
    """Read, interpolate, extend, merge and schema-check an experiment (no engine imports)."""
    source = Path(path)
    if not source.is_file():
        raise ConfigError(f"{path}: experiment file not found")
    provenance = Provenance()
    experiment: dict[str, Any] = {}
    for layer in load_with_extends(source, "experiment"):
        merge_layer(experiment, layer, provenance)

    items = parse_overrides(cli_tokens or [])
    module_names = list(experiment.get("modules") or {}) if isinstance(experiment.get("modules"), dict) else []
    experiment_items, param_items = _route(items, module_names)
    if experiment_items:
        merge_layer(experiment, overrides_layer(experiment_items), provenance)
    spec: ExperimentSpec = validate_model(ExperimentSpec, experiment, provenance)

    modules: dict[str, ResolvedModule] = {}
    for name, module in spec.modules.items():
        params: dict[str, Any] = {}
        prefix = f"modules.{name}"
        if backend_defaults is not None:
            defaults = backend_defaults(module.framework, module.stage,
                                        provenance.describe(f"{prefix}.framework"),
                                        provenance.describe(f"{prefix}.stage"))
            merge_layer(params, Layer("backend defaults", defaults,
                                      {}, {}), provenance, prefix=prefix)
        for layer in _preset_layers(name, module, source.resolve().parent, provenance):
            merge_layer(params, layer, provenance, prefix=prefix)
        merge_layer(params, _overrides_as_layer(name, module, provenance), provenance, prefix=prefix)
        if param_items.get(name):
            merge_layer(params, overrides_layer(param_items[name]), provenance, prefix=prefix)
        modules[name] = ResolvedModule(name, module.framework, module.stage, module.config, module.model, params)
    return ResolvedExperiment(source=source, spec=spec, modules=modules, provenance=provenance)


def format_why(resolved: ResolvedExperiment, key: str) -> str:
    """The chain of sources for one key, oldest first; the last line is the value in force."""
    candidates = [key]
    if not key.startswith("modules.") and key.split(".")[0] not in _EXPERIMENT_KEYS:
        candidates = [f"modules.{name}.{key}" for name in resolved.modules]
    lines = []
    for candidate in candidates:
        chain: list[Source] = resolved.provenance.chain(candidate)
        if not chain:
            continue
        lines.append(f"{candidate}:")
        for i, src in enumerate(chain):
            marker = "=>" if i == len(chain) - 1 else "  "
            lines.append(f"  {marker} {src.value!r:<24} from {src.label} ({src.where})")
    if not lines:
        raise ConfigError(f"--why {key}: no such key in the resolved config")
    return "\n".join(lines)

