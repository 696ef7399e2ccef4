"""Discover backend adapters through the ``primus.backends`` entry-point group.

Third-party packages add a backend by declaring an entry point (its adapter names its recipes);
nothing here imports an engine: adapters and recipes import their engine inside their methods.
"""
from __future__ import annotations

import importlib.metadata
from functools import cache

from primus.config.errors import ConfigError, did_you_mean
from primus.runtime.adapter import BackendAdapter

GROUP = "primus.backends"


@cache
def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=GROUP)}


def available_backends() -> list[str]:
    return sorted(_entry_points())


def adapter_classes() -> list[type[BackendAdapter]]:
    """Every installed backend's adapter class (cheap: engines are imported inside methods)."""
    return [_entry_points()[name].load() for name in available_backends()]


def get_adapter(framework: str, where: str = "framework") -> BackendAdapter:
    entry = _entry_points().get(framework)
    if entry is None:
        names = available_backends()
        raise ConfigError(
            f"{where}: unknown framework '{framework}'{did_you_mean(framework, names)}; "
            f"available: {', '.join(names) or 'none'}"
        )
    adapter_cls = entry.load()
    return adapter_cls()


def backend_defaults(framework: str, stage: str, where_framework: str = "framework",
                     where_stage: str = "stage") -> dict:
    adapter = get_adapter(framework, where_framework)
    return adapter.defaults(adapter.canonical_stage(stage, where_stage))


def backend_derived(framework: str, params: dict, stage: str = "pretrain") -> list:
    """What the backend sets itself from ``params`` (e.g. ``primus.tiny_assets`` paths), as
    ``(dotted key, value, reason)``; resolution applies it last and records it as derived."""
    adapter = get_adapter(framework)
    return adapter.derived_params(params, adapter.canonical_stage(stage))


def recipe_table() -> dict[tuple[str, str], str]:
    """(framework, stage) -> the recipe class that runs it, over every installed backend."""
    return {(cls.name, stage): path for cls in adapter_classes() for stage, path in cls.recipes.items()}
