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
from typing import Any, Protocol

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


class Dialect(Protocol):
    """Another project's spelling of experiments (AMD Primus's: ``primus.compat.AMD_PRIMUS``), put into
    resolution by its caller: config knows the hook, not the dialect."""

    def refuse(self, experiment: dict[str, Any], provenance: Provenance) -> None:
        """One line for a trainer or model family the dialect has and Primus does not run."""

    def unknown_model(self, framework: str, model: str) -> str | None:
        """Why a model preset of that name is not here (None: no reason known)."""

    presets: str  # the folder of the dialect's own presets, under ``modules/<framework>/`` and ``models/<framework>/``

    def owns(self, framework: str, overrides: dict[str, Any] | None, *, model: str | None = None,
             stage_explicit: bool = True) -> bool:
        """Is a module with these ``overrides`` (model preset ``model``, a ``stage:`` written or not) in the
        dialect's own format (resolved as it resolves)?"""

    def unread_top_level(self, experiment: dict[str, Any], known: set[str]) -> dict[str, Any]:
        """Top-level keys the dialect's parser never reads, removed from ``experiment`` and returned."""

    def unread_lines(self, unread: dict[str, Any], where: dict[str, str], module: str,
                     params: dict[str, Any]) -> list[Any]:
        """One record per unread key: what the module runs instead."""

    def translate(self, name: str, framework: str, params: dict[str, Any], *, stage: str, stage_explicit: bool,
                  experiment: dict[str, Any], provenance: Provenance, own_format: bool) -> tuple[str, list[Any]]:
        """Rewrite ``params`` (and ``experiment``'s logging) in place; the stage and the translations."""


@dataclass
class ResolvedModule:
    name: str
    framework: str
    stage: str
    config: str | None
    model: str | None
    params: dict[str, Any]
    translations: list[Any] = field(default_factory=list)  # the dialect's, e.g. primus.compat.Translation


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
                   dialect: Dialect | None, own_format: bool = False) -> list[Layer]:
    """The module preset's layers, then the model preset's (later wins). A module in the dialect's own
    format (``own_format``) reads the dialect's presets first (``modules/<framework>/<dialect.presets>/``,
    ``models/<framework>/<dialect.presets>/``) and, as that project merges them, its module preset wins over
    its model preset."""
    module_layers: list[Layer] = []
    if module.config:
        folder = CONFIGS_ROOT / "modules" / module.framework
        path = find_preset(module.config, [folder / dialect.presets, folder] if own_format else [folder],
                           relative_to=experiment_dir, what="module preset",
                           where=provenance.describe(f"modules.{name}.config"))
        module_layers = load_with_extends(path, "module preset")
    layers: list[Layer] = []
    if module.model:
        try:
            folders = [CONFIGS_ROOT / "models" / module.framework, CONFIGS_ROOT / "models" / "common"]
            path = find_preset(module.model, [folders[0] / dialect.presets, *folders] if own_format else folders,
                               relative_to=experiment_dir, what="model preset",
                               where=provenance.describe(f"modules.{name}.model"))
        except ConfigError:
            reason = dialect.unknown_model(module.framework, module.model) if dialect is not None else None
            if reason is None:
                raise
            raise ConfigError(f"{provenance.describe(f'modules.{name}.model')}: model preset '{module.model}': "
                              f"{reason}") from None
        layers += load_with_extends(path, "model preset")
    return layers + module_layers if own_format else module_layers + layers


def resolve_experiment(path: str | Path, cli_tokens: list[str] | None = None,
                       backend_defaults: DefaultsFn | None = None, derive: DeriveFn | None = None, *,
                       dialect: Dialect | None = None) -> ResolvedExperiment:
    """Read, interpolate, extend, merge and schema-check an experiment (no engine imports). The layers
    above put in the backends' defaults and derivations and another project's ``dialect``."""
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
    unread: dict[str, Any] = {}
    if dialect is not None:  # before the schema: other trainers' files differ in more ways
        dialect.refuse(experiment, provenance)
        unread = dialect.unread_top_level(experiment, _EXPERIMENT_KEYS)  # e.g. AMD Primus's modules:-less LoRA file
    unread_where = {key: provenance.describe(key) for key in unread}
    remember_secrets(experiment)  # from here on, errors mask them
    spec: ExperimentSpec = validate_model(ExperimentSpec, experiment, provenance)

    modules: dict[str, ResolvedModule] = {}
    for name, module in spec.modules.items():
        params: dict[str, Any] = {}
        prefix = f"modules.{name}"
        stage_explicit = bool(provenance.chain(f"{prefix}.stage"))  # before params share the key's namespace
        # the files' own stage: (a command-line one does not change the format the files are written in)
        stage_written = any(src.label != "command line" for src in provenance.chain(f"{prefix}.stage"))
        if backend_defaults is not None:
            defaults = backend_defaults(module.framework, module.stage,
                                        provenance.describe(f"{prefix}.framework"),
                                        provenance.describe(f"{prefix}.stage"))
            merge_layer(params, Layer("backend defaults", defaults,
                                      {}, {}), provenance, prefix=prefix)
        own_format = dialect is not None and dialect.owns(module.framework, module.overrides, model=module.model,
                                                          stage_explicit=stage_written)
        for layer in _preset_layers(name, module, source.resolve().parent, provenance, dialect, own_format):
            merge_layer(params, layer, provenance, prefix=prefix)
        merge_layer(params, _overrides_as_layer(name, module, provenance), provenance, prefix=prefix)
        if param_items.get(name):
            merge_layer(params, overrides_layer(param_items[name]), provenance, prefix=prefix)
        stage, translations = module.stage, []
        if dialect is not None:
            stage, translations = _translate(dialect, name, module, params, spec, provenance, stage_explicit,
                                             own_format)
        remember_secrets(params)
        if derive is not None:  # last: what Primus derives wins, and says so (--why, provenance.overridden)
            for key, value, reason in derive(module.framework, params, stage):
                _set_dotted(params, key, value)
                provenance.record_derived(f"{prefix}.{key}", value, reason)
        if unread:
            translations += dialect.unread_lines(unread, unread_where, name, params)
        modules[name] = ResolvedModule(name, module.framework, stage, module.config, module.model, params,
                                       translations)
    return ResolvedExperiment(source=source, spec=spec, modules=modules, provenance=provenance)


def _translate(dialect: Dialect, name: str, module: ModuleSpec, params: dict[str, Any], spec: ExperimentSpec,
               provenance: Provenance, stage_explicit: bool, own_format: bool):
    """The dialect's spellings -> ours, in place; the module's stage may follow them."""
    experiment = {"logging": spec.logging.model_dump()}
    stage, translations = dialect.translate(name, module.framework, params, stage=module.stage,
                                            stage_explicit=stage_explicit, experiment=experiment,
                                            provenance=provenance, own_format=own_format)
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

