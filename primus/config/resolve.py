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

from primus.compat.dialect import amd_marker, unread_lines, unread_top_level
from primus.config.errors import ConfigError
from primus.config.overrides import overrides_layer, parse_overrides
from primus.config.presets import CONFIGS_ROOT, find_preset, load_with_extends
from primus.config.provenance import Provenance, Source, merge_layer
from primus.config.schema import ExperimentSpec, LoggingSpec, ModuleSpec, validate_model
from primus.config.secrets import REDACTED, externalize_secrets, is_secret_key, redact_tree, remember_secrets
from primus.config.yaml_source import Layer

DefaultsFn = Callable[[str, str, str, str], dict[str, Any]]  # (framework, stage, where, where) -> defaults
# (framework, params) -> [(dotted key under params, value, reason)]: what the backend sets itself
DeriveFn = Callable[[str, dict[str, Any]], list[tuple[str, Any, str]]]


@dataclass
class ResolvedModule:
    name: str
    framework: str
    stage: str
    config: str | None
    model: str | None
    params: dict[str, Any]
    translations: list[Any] = field(default_factory=list)  # primus.compat.Translation, AMD Primus names


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
                   "params": m.params,
                   **({"translated": [t.to_dict() for t in m.translations]} if m.translations else {})}
            for name, m in self.modules.items()
        }
        return head

    def _templates(self) -> dict[str, str]:
        """``${VAR}`` templates keyed as in ``tree()``."""
        templates = {}
        for key, raw in self.provenance.templates.items():
            # provenance keys for params are modules.<m>.<path>; the saved tree nests them under params
            parts = key.split(".")
            if parts[0] == "modules" and len(parts) > 2 and parts[2] not in ModuleSpec.model_fields:
                key = ".".join([*parts[:2], "params", *parts[2:]])
            templates[key] = raw
        return templates

    def redacted_tree(self) -> dict[str, Any]:
        """For display: secrets as their ``${VAR}`` reference, or ``<redacted>``."""
        return redact_tree(self.tree(), self._templates())

    def saved_tree(self) -> tuple[dict[str, Any], dict[str, str]]:
        """For ``config.resolved.yaml``: every secret as a ``${VAR}`` reference, and the variables
        the launcher sets so that its workers read the literal secrets back."""
        return externalize_secrets(self.tree(), self._templates())


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


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[leaf] = value


def _overrides_as_layer(name: str, spec: ModuleSpec, provenance: Provenance) -> Layer:
    prefix = f"modules.{name}.overrides"
    origins = {key[len(prefix) + 1:]: chain[-1].where
               for key, chain in provenance.chains.items() if key.startswith(prefix + ".")}
    templates = {key[len(prefix) + 1:]: raw
                 for key, raw in provenance.templates.items() if key.startswith(prefix + ".")}
    return Layer("experiment overrides", spec.overrides, origins, templates)


def _preset_layers(name: str, module: ModuleSpec, experiment_dir: Path, provenance: Provenance,
                   amd_format: bool = False) -> list[Layer]:
    """The module preset's layers, then the model preset's (later wins). A module in AMD Primus's format
    reads AMD Primus's module presets first (``modules/<framework>/amd/``) and, as AMD Primus merges them,
    its module preset wins over its model preset (primus/compat/dialect.py)."""
    module_layers: list[Layer] = []
    if module.config:
        folder = CONFIGS_ROOT / "modules" / module.framework
        path = find_preset(module.config, [folder / "amd", folder] if amd_format else [folder],
                           relative_to=experiment_dir, what="module preset",
                           where=provenance.describe(f"modules.{name}.config"))
        module_layers = load_with_extends(path, "module preset")
    layers: list[Layer] = []
    if module.model:
        try:
            path = find_preset(module.model, [CONFIGS_ROOT / "models" / module.framework,
                                              CONFIGS_ROOT / "models" / "common"],
                               relative_to=experiment_dir, what="model preset",
                               where=provenance.describe(f"modules.{name}.model"))
        except ConfigError:
            from primus.compat.families import model_reason  # an AMD Primus family Primus does not run

            reason = model_reason(module.framework, module.model)
            if reason is None:
                raise
            raise ConfigError(f"{provenance.describe(f'modules.{name}.model')}: model preset '{module.model}': "
                              f"{reason}") from None
        layers += load_with_extends(path, "model preset")
    return layers + module_layers if amd_format else module_layers + layers


def resolve_experiment(path: str | Path, cli_tokens: list[str] | None = None,
                       backend_defaults: DefaultsFn | None = None, derive: DeriveFn | None = None) -> ResolvedExperiment:
    """Read, interpolate, extend, merge and schema-check an experiment (no engine imports)."""
    source = Path(path)
    if source.is_dir():
        raise ConfigError(f"{path}: is a directory, not an experiment file")
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
    _refuse_other_trainers(experiment, provenance)  # before the schema: their files differ in more ways
    unread = unread_top_level(experiment, _EXPERIMENT_KEYS)  # AMD Primus's modules:-less LoRA file
    unread_where = {key: provenance.describe(key) for key in unread}
    remember_secrets(experiment)  # from here on, errors mask them
    spec: ExperimentSpec = validate_model(ExperimentSpec, experiment, provenance)

    modules: dict[str, ResolvedModule] = {}
    for name, module in spec.modules.items():
        params: dict[str, Any] = {}
        prefix = f"modules.{name}"
        stage_explicit = bool(provenance.chain(f"{prefix}.stage"))  # before params share the key's namespace
        if backend_defaults is not None:
            defaults = backend_defaults(module.framework, module.stage,
                                        provenance.describe(f"{prefix}.framework"),
                                        provenance.describe(f"{prefix}.stage"))
            merge_layer(params, Layer("backend defaults", defaults,
                                      {}, {}), provenance, prefix=prefix)
        amd_format = amd_marker(module.framework, module.overrides) is not None
        for layer in _preset_layers(name, module, source.resolve().parent, provenance, amd_format):
            merge_layer(params, layer, provenance, prefix=prefix)
        merge_layer(params, _overrides_as_layer(name, module, provenance), provenance, prefix=prefix)
        if param_items.get(name):
            merge_layer(params, overrides_layer(param_items[name]), provenance, prefix=prefix)
        stage, translations = _translate_amd_names(name, module, params, spec, provenance, stage_explicit,
                                                   amd_format)
        remember_secrets(params)
        if derive is not None:  # last: what Primus derives wins, and says so (--why, provenance.overridden)
            for key, value, reason in derive(module.framework, params, stage):
                _set_dotted(params, key, value)
                provenance.record_derived(f"{prefix}.{key}", value, reason)
        translations += unread_lines(unread, unread_where, name, params)
        modules[name] = ResolvedModule(name, module.framework, stage, module.config, module.model, params,
                                       translations)
    return ResolvedExperiment(source=source, spec=spec, modules=modules, provenance=provenance)


def _refuse_other_trainers(experiment: dict[str, Any], provenance: Provenance) -> None:
    """AMD Primus's trainers and model families Primus does not run (MaxText, Megatron-Bridge, Flux, ...):
    one line with the reason, before the schema trips over the other keys their files carry."""
    from primus.compat.families import framework_reason, model_reason

    modules = experiment.get("modules")
    for name, module in (modules.items() if isinstance(modules, dict) else ()):
        if not isinstance(module, dict):
            continue
        framework, model = str(module.get("framework")), module.get("model")
        reason = framework_reason(framework)
        key = f"modules.{name}.framework"
        if reason is None and isinstance(model, str):
            reason, key = model_reason(framework, model), f"modules.{name}.model"
        if reason is not None:
            what = f"framework '{framework}'" if key.endswith("framework") else f"model preset '{model}'"
            raise ConfigError(f"{provenance.describe(key)}: {what}: {reason}")
        if "trainer_class" in module:
            key = f"modules.{name}.trainer_class"
            raise ConfigError(f"{provenance.describe(key)}: {key}: AMD Primus's trainer class "
                              f"'{module['trainer_class']}' is not a Primus trainer: the framework's own trainer "
                              f"runs (remove trainer_class)")


def _translate_amd_names(name: str, module: ModuleSpec, params: dict[str, Any], spec: ExperimentSpec,
                         provenance: Provenance, stage_explicit: bool, amd_format: bool):
    """AMD Primus's spellings -> ours (primus/compat), in place; the module's stage may follow them."""
    from primus.compat import translate_module

    experiment = {"logging": spec.logging.model_dump()}
    stage, translations = translate_module(
        name, module.framework, params, stage=module.stage,
        stage_explicit=stage_explicit, experiment=experiment,
        provenance=provenance, amd_format=amd_format)
    spec.logging = validate_model(LoggingSpec, experiment["logging"], provenance, "logging")
    return stage, translations


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
        secret = is_secret_key(candidate)
        for i, src in enumerate(chain):
            marker = "=>" if i == len(chain) - 1 else "  "
            value = REDACTED if secret and src.value not in (None, "{...}") else repr(src.value)
            lines.append(f"  {marker} {value:<24} from {src.label} ({src.where})")
    if not lines:
        raise ConfigError(f"--why {key}: no such key in the resolved config")
    return "\n".join(lines)

