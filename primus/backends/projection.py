"""Which backend knows how its settings read for the step-time projection (``primus.plan.projection``).

Each LLM backend has a ``projection`` module: ``projection_options`` (fp8, interleaving, recompute,
overlaps, fused kernels from the engine's own settings), ``layout_overrides`` (a searched layout as that
engine's keys), ``RECOMPUTES`` and ``SHARDINGS`` (what its search may choose).
"""
from __future__ import annotations

from importlib import import_module
from typing import Any

from primus.config.errors import ConfigError

PROJECTED = ("megatron", "torchtitan")


def backend_projection(framework: str):
    if framework not in PROJECTED:
        raise ConfigError(f"--project/--search: framework '{framework}' is not projected yet "
                          f"({' and '.join(PROJECTED)} LLMs are)")
    return import_module(f"primus.backends.{framework}.projection")


def projection_options(framework: str, engine_plan: Any, *, gpu: bool, translations=()):
    """The ``ProjectionOptions`` of a module's ``EnginePlan`` (``translations``: the AMD keys Primus
    set aside, where float8 converters of a TorchTitan experiment are kept)."""
    backend = backend_projection(framework)
    if framework == "megatron":
        return backend.projection_options(engine_plan.engine_config, gpu=gpu)
    converters: list[str] = []
    for item in translations:
        if item.source.endswith("converters"):
            converters += [item.value] if isinstance(item.value, str) else list(item.value or [])
    return backend.projection_options(engine_plan.module.params, gpu=gpu, converters=converters)
