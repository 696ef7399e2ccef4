"""What the compatibility layer does when a run starts (the translations themselves happen at resolve).

- the launcher refuses a run whose experiment turns on an AMD feature this Primus cannot honour
  (``refuse_at_run``: ``config validate``, ``plan`` and ``train --dry-run`` accepted it);
- each rank logs the ``translated …`` lines once, and for every AMD kernel switch that is on, a
  ``derived … (Primus-Turbo not installed)`` line naming the kernel that runs instead.

(What AMD's files name by Hugging Face Hub id is fetched by each engine's recipe, with ``hub.py``.)
"""
from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from primus.compat.rules import Translation
from primus.config.errors import ConfigError


def translations_of(section: dict[str, Any]) -> list[Translation]:
    """The translations saved with a module of ``config.resolved.yaml`` (``modules.<m>.translated``)."""
    return [Translation.from_dict(entry) for entry in section.get("translated") or []]


def check_runnable(module: Any) -> None:
    """Refuse, in one line, a run that needs an AMD feature not available here (exit 2, nothing started)."""
    for translation in getattr(module, "translations", []):
        if translation.kind == "refuse_at_run":
            where = f"{translation.where}: " if translation.where else ""
            raise ConfigError(f"{where}modules.{module.name}.{translation.source}={translation.value!r}: "
                              f"{translation.why} (config validate, plan and --dry-run accept it; a run cannot)")


def announce(translations: list[Translation], log: Callable[[str], None],
             log_derived: Callable[[str, object, str], None]) -> None:
    """One ``translated …`` line per AMD key; the kernel that runs for each AMD kernel switch that is on."""
    turbo = "Primus-Turbo not installed" if importlib.util.find_spec("primus_turbo") is None \
        else "Primus does not call Primus-Turbo"
    for translation in translations:
        log(translation.line())
        if translation.kind == "kernel":
            log_derived(translation.source, "stock kernel", turbo)
