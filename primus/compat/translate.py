"""Apply a framework's compat table to one resolved module, before any engine sees it.

Runs once per module in ``resolve_experiment``, after every layer is merged: an AMD key is only
ever written by the user's own files (our presets use our names), so the merged tree holds each
AMD key with the file:line that set it. Each key found becomes one ``Translation``; provenance
records the new key as set by the old key's line (``config show --why`` shows both names).
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from primus.compat.rules import Rule, Translation
from primus.config.errors import ConfigError
from primus.config.provenance import Provenance, Source

# Layer labels in precedence order (later wins); "(extends)" variants rank as their file.
_RANKS = {"backend defaults": 0, "module preset": 1, "model preset": 2, "experiment": 3,
          "experiment overrides": 3, "command line": 4}


def _rank(label: str) -> int:
    return _RANKS.get(label.split(" (")[0], 3)


@dataclass
class CompatContext:
    """What a rule may change: the module's params and stage, the experiment's logging block."""

    module: str
    framework: str
    params: dict[str, Any]
    stage: str
    stage_explicit: bool
    experiment: dict[str, Any]  # experiment-level settings a rule may set ("logging": {...})
    provenance: Provenance
    translations: list[Translation] = field(default_factory=list)
    amd_format: bool = False  # an AMD Primus-format module (primus/compat/dialect.py): AMD's dropping rules apply
    amd: dict[str, Any] = field(default_factory=dict)  # the AMD keys found, with their values

    @property
    def prefix(self) -> str:
        return f"modules.{self.module}"

    def where(self, key: str) -> str:
        return self.provenance.describe(f"{self.prefix}.{key}")

    def last_source(self, key: str, experiment: bool = False) -> Source | None:
        chain = self.provenance.chain(key if experiment else f"{self.prefix}.{key}")
        return chain[-1] if chain else None

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.where(key)}: {self.prefix}.{key}: {message}")

    def get(self, key: str, default: Any = None) -> Any:
        node: Any = self.params
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    # -- writing ---------------------------------------------------------------------------
    def set(self, source: str, value: Any, target: str, why: str, *, experiment: bool = False) -> None:
        """Write ``value`` at ``target`` for the AMD key ``source``, unless a later layer set the target."""
        origin = self.last_source(source)
        current = self.last_source(target, experiment)
        tree = self.experiment if experiment else self.params
        where = origin.where if origin else ""
        if _has(tree, target) and current is not None and origin is not None:
            if _rank(current.label) > _rank(origin.label):
                self._record(Translation(source, self.amd.get(source, value), target,
                                         f"{why}; but {current.where} sets {target} and wins", "rename", where,
                                         _get(tree, target)))
                return
            if _rank(current.label) == _rank(origin.label) and _get(tree, target) != value \
                    and current.label != "backend defaults":
                raise ConfigError(f"{where}: {self.prefix}.{source}: is AMD Primus's name for {target}, "
                                  f"which {current.where} also sets (to {_get(tree, target)!r}): keep one")
        _set(tree, target, copy.deepcopy(value))
        full = target if experiment else f"{self.prefix}.{target}"
        label = f"{origin.label if origin else 'translated'}, as {source}"
        self.provenance.record(full, Source(label, where or "compat", value))
        self._record(Translation(source, self.amd.get(source, value), target, why, "rename", where, value))

    def note(self, source: str, value: Any, why: str, kind: str = "inert", feature: str | None = None) -> None:
        """The AMD key has no effect here (or only at run time, ``kind``): say so. A ``refuse_at_run``
        note naming a ``feature`` (a row of ``primus.runtime.capabilities``) is refused only where the
        target lacks that feature."""
        origin = self.last_source(source)
        self._record(Translation(source, value, None, why, kind, origin.where if origin else "", feature=feature))

    def joined(self, source: str, value: Any, first: Translation, why: str) -> None:
        """``source`` went into the same setting as an earlier translation (``beta2`` with ``beta1``)."""
        origin = self.last_source(source)
        self._record(Translation(source, value, first.target, why, "rename", origin.where if origin else "",
                                 first.target_value))

    def set_stage(self, source: str, value: Any, stage: str, why: str) -> None:
        """The AMD key names the module's stage (``stage: sft``, AutoModel's ``model.mode``)."""
        self.stage = stage
        origin = self.last_source(source)
        self._record(Translation(source, value, "stage", why, "stage", origin.where if origin else "", stage))

    def _record(self, translation: Translation) -> None:
        """Keep the translation; ``--why`` on the AMD key shows what it became."""
        self.translations.append(translation)
        outcome = translation.line().split(" → ", 1)[1]
        self.provenance.record(f"{self.prefix}.{translation.source}",  # where stays file:line (errors cite it)
                               Source(f"AMD Primus name → {outcome}", translation.where or "compat",
                                      translation.value))


def _has(tree: dict[str, Any], dotted: str) -> bool:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _get(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        node = node[part]
    return node


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[leaf] = value


def _pop(tree: dict[str, Any], dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    chain = [tree]
    for part in parents:
        chain.append(chain[-1][part])
    chain[-1].pop(leaf, None)
    for depth in range(len(parents), 0, -1):  # prune sections the translation emptied
        if chain[depth] == {}:
            chain[depth - 1].pop(parents[depth - 1], None)
        else:
            break


# An environment variable's name among a module's keys (AMD's ``HSA_NO_SCRATCH_RECLAIM: 1`` in
# overrides): the rule stored under this key covers every such top-level key.
ENVIRONMENT_NAME = "<ENVIRONMENT_VARIABLE>"
_ENVIRONMENT = re.compile(r"^[A-Z][A-Z0-9]*(_[A-Z0-9]+)+$")


def covered(params: dict[str, Any], rules: dict[str, Rule]) -> list[tuple[str, Rule, Any]]:
    """(dotted key, rule, value) for every key of ``params`` a rule covers, in file order."""
    found: list[tuple[str, Rule, Any]] = []
    prefixes = {key.rsplit(".", 1)[0] for key in rules if "." in key}
    prefixes |= {p.rsplit(".", i)[0] for p in list(prefixes) for i in range(1, p.count(".") + 1)}

    def walk(node: dict[str, Any], path: str) -> None:
        for key, value in list(node.items()):
            dotted = f"{path}.{key}" if path else key
            rule = rules.get(dotted) or (rules.get(f"{path}.*") if path else
                                         rules.get(ENVIRONMENT_NAME) if _ENVIRONMENT.match(key) else None)
            if rule is not None:
                found.append((dotted, rule, value))
            elif isinstance(value, dict) and dotted in prefixes:
                walk(value, dotted)

    walk(params, "")
    return found


def apply_rules(ctx: CompatContext, rules: dict[str, Rule]) -> None:
    """Translate every covered key of ``ctx.params`` (the sources are removed first)."""
    matches = covered(ctx.params, rules)
    ctx.amd.update({dotted: value for dotted, _, value in matches})
    for dotted, _, _ in matches:
        _pop(ctx.params, dotted)
    for dotted, rule, value in matches:
        _apply(ctx, dotted, rule, value)


def _wildcard_target(rule: Rule, dotted: str) -> str:
    if rule.target and rule.target.endswith(".*"):
        section = rule.key[:-2]
        return rule.target[:-2] + dotted[len(section):]
    return rule.target or ""


def _apply(ctx: CompatContext, dotted: str, rule: Rule, value: Any) -> None:
    if rule.action == "rename":
        try:
            converted = rule.convert(value) if rule.convert else value
        except (TypeError, ValueError) as exc:  # a value of the wrong type for the AMD key
            raise ctx.fail(dotted, str(exc)) from None
        ctx.set(dotted, converted, _wildcard_target(rule, dotted), rule.why, experiment=rule.experiment)
    elif rule.action == "inert":
        ctx.note(dotted, value, rule.why)
    elif rule.action == "kernel":
        ctx.note(dotted, value, rule.why if not rule.is_off(value) else f"{rule.why}; off",
                 kind="kernel" if not rule.is_off(value) else "inert")
    elif rule.action == "unsupported":
        if rule.is_off(value):
            ctx.note(dotted, value, f"{rule.why}; off")
        elif rule.when == "resolve":
            raise ctx.fail(dotted, f"AMD Primus option not supported here: {rule.why}")
        else:
            ctx.note(dotted, value, rule.why, kind="refuse_at_run")
    elif rule.action == "custom":
        assert rule.function is not None
        rule.function(value, ctx, dotted)
