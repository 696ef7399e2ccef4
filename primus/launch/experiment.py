"""An experiment file as every ``primus`` command reads it: the backends' defaults under the presets,
AMD Primus's spellings translated, what the backends derive on top (``primus.config.resolve``)."""
from __future__ import annotations

from pathlib import Path

from primus.compat import AMD_PRIMUS
from primus.config.resolve import ResolvedExperiment, resolve_experiment
from primus.runtime.registry import backend_defaults, backend_derived


def resolve(path: str | Path, overrides: list[str] | None = None) -> ResolvedExperiment:
    return resolve_experiment(path, overrides, backend_defaults, backend_derived, dialect=AMD_PRIMUS)
