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

import importlib.abc
import importlib.machinery
import sys

from primus.runtime.lazy_compile import DeferringLoader, lazy_compile  # noqa: F401  (lazy_compile: re-exported)
from primus.runtime.patches import Patch, Where

JIT_MODULE = "megatron.core.jit"


class _LazyFusionFinder(importlib.abc.MetaPathFinder):
    """Finds ``megatron.core.jit`` as the path finder would, and hands it to ``DeferringLoader`` where
    ``record`` (the registry's ``patch_lazy_fusion_compile``) applies on this host."""

    def __init__(self, record: "Patch"):
        self.record = record

    def find_spec(self, fullname, path, target=None):
        if fullname != JIT_MODULE or not self.record.verdict(_here())[0]:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = DeferringLoader(spec.loader)
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
