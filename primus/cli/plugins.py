"""Register subcommands from modules that may be absent (optional backends and tools)."""
from __future__ import annotations

import importlib


def register_optional(module_names: list[str], subparsers) -> None:
    """Call ``register(subparsers)`` of each module that imports; skip the ones not installed."""
    for module_name in module_names:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue
            raise
        module.register(subparsers)
