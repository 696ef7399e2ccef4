"""Merge layers with one precedence rule (later wins) and remember who set every leaf."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from primus.config.secrets import shown_value
from primus.config.yaml_source import Layer


@dataclass(frozen=True)
class Source:
    label: str  # "backend defaults", "module preset", "model preset", "experiment overrides", "command line"
    where: str  # "file.yaml:12", "--training.steps=5", "torchtitan defaults"
    value: Any


DERIVED = "derived by Primus"  # a value Primus sets itself (tiny assets, CPU choices): the last link of a chain
EXPLICIT = ("experiment overrides", "command line")  # what the user wrote for this run


@dataclass
class Provenance:
    """dotted key -> the ordered chain of sources that set it (the last one won)."""

    chains: dict[str, list[Source]] = field(default_factory=dict)
    templates: dict[str, str] = field(default_factory=dict)  # dotted key -> raw ${VAR} text
    overridden: list[str] = field(default_factory=list)  # one line per explicit value a derivation replaced

    def record(self, key: str, source: Source) -> None:
        self.chains.setdefault(key, []).append(source)

    def record_derived(self, key: str, value: Any, reason: str) -> None:
        """Primus set ``key`` itself. When that replaces what the user wrote (experiment overrides,
        command line), it is said: one line in ``overridden`` for the launcher to print."""
        explicit = next((s for s in reversed(self.chains.get(key, [])) if s.label in EXPLICIT), None)
        if explicit is not None and explicit.value != value:
            value, replaced = shown_value(key, value), shown_value(key, explicit.value)
            self.overridden.append(f"{key}={value!r} from {reason} replaces {replaced!r} ({explicit.where}): "
                                   f"{reason} wins; set it to null to use your value")
        self.record(key, Source(DERIVED, reason, value))

    def describe(self, key: str) -> str:
        """Where the winning value of ``key`` (or its closest set ancestor) came from."""
        probe = key
        while probe:
            chain = self.chains.get(probe)
            if chain:
                return chain[-1].where
            probe = probe.rpartition(".")[0]
        return "the resolved config"

    def chain(self, key: str) -> list[Source]:
        return list(self.chains.get(key, []))


def merge_layer(base: dict[str, Any], layer: Layer, provenance: Provenance, *, prefix: str = "",
                origin_prefix: str = "") -> dict[str, Any]:
    """Deep-merge ``layer.data`` onto ``base`` (mutates and returns it).

    ``prefix`` namespaces the provenance keys (``modules.pre_trainer``); ``origin_prefix`` is
    the part of the layer's own dotted keys to drop (the ``modules.x.overrides`` of an
    experiment file) when looking up file:line.
    """

    def where(local_key: str) -> str:
        lookup = f"{origin_prefix}.{local_key}" if origin_prefix else local_key
        return layer.origins.get(lookup, layer.label)

    def walk(target: dict[str, Any], data: dict[str, Any], path: str) -> None:
        for key, value in data.items():
            local = f"{path}.{key}" if path else key
            full = f"{prefix}.{local}" if prefix else local
            if isinstance(value, dict) and isinstance(target.get(key), dict):
                provenance.record(full, Source(layer.label, where(local), "{...}"))
                walk(target[key], value, local)
                continue
            target[key] = copy.deepcopy(value)
            _record_subtree(full, local, value)

    def _record_subtree(full: str, local: str, value: Any) -> None:
        template_key = f"{origin_prefix}.{local}" if origin_prefix else local
        if template_key in layer.templates:
            provenance.templates[full] = layer.templates[template_key]
        if isinstance(value, dict):
            provenance.record(full, Source(layer.label, where(local), "{...}"))
            for key, child in value.items():
                _record_subtree(f"{full}.{key}", f"{local}.{key}", child)
        else:
            provenance.record(full, Source(layer.label, where(local), value))

    walk(base, layer.data, "")
    return base
