"""megatron-core's fused functions compiled on their first call, not when megatron-core is imported.

megatron-core's ``jit_fuser`` is ``torch.compile`` (``megatron/core/jit.py``), applied at import to
about forty fused functions; each ``torch.compile(fn)`` imports TorchDynamo and Inductor, so every
process that imports megatron-core (a launcher checking admission, each rank) spends about 2.5 s of
CPU on compiler imports, whether or not a fused function ever runs.

``install`` adds a ``sys.meta_path`` finder that runs ``megatron.core.jit`` with ``torch.compile``
replaced by ``lazy_compile``: ``jit_fuser`` becomes a decorator that calls the real ``torch.compile``,
with the same arguments, on the function's first call. ``torch.compile`` itself is put back as soon
as that module has run. Whether the finder acts is the registry's ``patch_lazy_fusion_compile`` record
(its version range and condition), decided when megatron-core is first imported.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from typing import Any

from primus.runtime.patches import Patch, Swaps, Where

JIT_MODULE = "megatron.core.jit"


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


class _JitModuleLoader(importlib.abc.Loader):
    """megatron-core's own loader for ``megatron/core/jit.py``, run with ``torch.compile`` deferred."""

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


class _LazyFusionFinder(importlib.abc.MetaPathFinder):
    """Finds ``megatron.core.jit`` as the path finder would, and hands it to ``_JitModuleLoader`` where
    ``record`` (the registry's ``patch_lazy_fusion_compile``) applies on this host."""

    def __init__(self, record: "Patch"):
        self.record = record

    def find_spec(self, fullname, path, target=None):
        if fullname != JIT_MODULE or not self.record.verdict(_here())[0]:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _JitModuleLoader(spec.loader)
        return spec


def _here() -> Where:
    """This host, without ``torch.cuda.get_device_name`` (``Where.here``): on a GPU node that would create a
    CUDA context in whatever process imports megatron-core first, a launcher checking admission included."""
    import torch

    return Where(torch.cuda.is_available(), uses=frozenset())


def install(record: "Patch") -> None:
    """Put the finder first on ``sys.meta_path``, for the process (once): ``primus.backends.megatron``
    installs it when imported, before any megatron-core import; it acts on that first import only."""
    if not any(isinstance(finder, _LazyFusionFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _LazyFusionFinder(record))
