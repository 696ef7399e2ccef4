"""What the compatibility layer does when a run starts (the translations themselves happen at resolve).

- admission (``primus.runtime.admission``: ``config validate``, ``plan``, ``train --dry-run`` and the
  launch) refuses a run whose experiment turns on an AMD feature its target cannot run
  (``refuse_at_run``, decided per target where the note names a ``primus.runtime.capabilities`` row);
- each rank logs the ``translated …`` lines once, and for every AMD kernel switch that is on, a
  ``derived … (Primus-Turbo not installed)`` line naming the kernel that runs instead.

(What AMD's files name by Hugging Face Hub id is fetched by each engine's recipe, with ``hub.py``.)
"""
from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from primus.compat.rules import Translation


def translations_of(section: dict[str, Any]) -> list[Translation]:
    """The translations saved with a module of ``config.resolved.yaml`` (``modules.<m>.translated``)."""
    return [Translation.from_dict(entry) for entry in section.get("translated") or []]


def announce(translations: list[Translation], log: Callable[[str], None],
             log_derived: Callable[[str, object, str], None]) -> None:
    """One ``translated …`` line per AMD key; the kernel that runs for each AMD kernel switch that is on."""
    turbo = "Primus-Turbo not installed" if importlib.util.find_spec("primus_turbo") is None \
        else "Primus does not call Primus-Turbo"
    for translation in translations:
        log(translation.line())
        if translation.kind == "kernel":
            log_derived(translation.source, "stock kernel", turbo)
