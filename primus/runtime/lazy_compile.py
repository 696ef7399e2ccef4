"""``torch.compile`` deferred to a function's first call, for engine modules that compile at import.

megatron-core (``jit_fuser``) and TorchTitan (``FlexAttention``'s class body, ``create_block_mask``) call
``torch.compile`` when their modules are imported; each call imports TorchDynamo and Inductor's
``compile_fx`` (about 1 s of CPU), in every process that imports the engine (a launcher planning a run,
each rank), whether or not a compiled function ever runs. ``DeferredCompileFinder`` runs the named
modules with ``torch.compile`` replaced by ``lazy_compile``: the same call, with the same arguments, made
on the function's first call. ``torch.compile`` itself is put back as soon as each module has run.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from typing import Any

from primus.runtime.patches import Patch, Swaps, Where


def lazy_compile(compile_now: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile``'s calling convention (``compile(fn, **options)`` or ``compile(**options)(fn)``),
    deferring ``compile_now(fn, **options)`` to the first call of ``fn``."""

    def decorate(model: Callable[..., Any] | None = None, **options: Any) -> Any:
        if model is None:
            return functools.partial(decorate, **options)
        compiled: Callable[..., Any] | None = None

        @functools.wraps(model)
        def compiled_on_first_call(*args: Any, **kwargs: Any) -> Any:
            nonlocal compiled
            if compiled is None:
                compiled = compile_now(model, **options)
            return compiled(*args, **kwargs)

        return compiled_on_first_call

    return decorate


class DeferringLoader(importlib.abc.Loader):
    """The module's own loader, run with ``torch.compile`` deferred."""

    def __init__(self, loader: importlib.abc.Loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        import torch

        swaps = Swaps()
        swaps.set(torch, "compile", lazy_compile(torch.compile))
        try:
            self.loader.exec_module(module)
        finally:
            swaps.restore()


class DeferredCompileFinder(importlib.abc.MetaPathFinder):
    """Finds ``modules`` as the path finder would, and hands each to a ``DeferringLoader`` where ``applies()``
    (a patch record's verdict for this host) says so, when the module is first imported."""

    def __init__(self, modules: frozenset[str], applies: Callable[[], bool]):
        self.modules, self.applies = modules, applies

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.modules or not self.applies():
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = DeferringLoader(spec.loader)
        return spec


def install_deferred_compile(modules: frozenset[str], record: Patch) -> None:
    """Put a ``DeferredCompileFinder`` for ``modules`` first on ``sys.meta_path`` (once), acting where
    ``record``'s verdict for this host says so: it must be in place before the engine's first import, so an
    engine's patch installs it when its backend is imported, and a run's ``Patcher`` finds it there. The
    verdict is asked without ``torch.cuda.get_device_name`` (no CUDA context in a launcher)."""
    if any(isinstance(finder, DeferredCompileFinder) and finder.modules == modules for finder in sys.meta_path):
        return

    def applies() -> bool:
        import torch

        return record.verdict(Where(torch.cuda.is_available(), uses=frozenset()))[0]

    sys.meta_path.insert(0, DeferredCompileFinder(modules, applies))
