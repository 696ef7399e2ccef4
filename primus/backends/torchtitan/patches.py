"""Engine-compatibility patches for TorchTitan, each named, version-gated and conditional.

Every patch says why it exists, which versions it applies to, and when (``needed``). None
applies on a CUDA/ROCm host with a current torch. ``apply_patches`` must run before any
other ``torchtitan`` import, because TorchTitan resolves its device at import time.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version


@dataclass(frozen=True)
class Patch:
    name: str
    why: str
    package: str  # whose version gates the patch
    versions: SpecifierSet
    needed: Callable[[], bool]
    apply: Callable[[], None]

    def applies(self) -> bool:
        try:
            version = Version(importlib.metadata.version(self.package))
        except importlib.metadata.PackageNotFoundError:
            return False
        return self.versions.contains(version, prereleases=True) and self.needed()


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


def _cpu_device_module() -> types.ModuleType:
    """The subset of the ``torch.cuda`` API TorchTitan calls, answered for the host CPU."""
    module = types.ModuleType("primus_cpu_device")
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    module.set_device = lambda *a, **k: None
    module.device_count = lambda: 1
    module.current_device = lambda: 0
    module.is_available = lambda: True
    module.synchronize = lambda *a, **k: None
    module.get_device_name = lambda *a, **k: "cpu"
    module.get_device_properties = lambda *a, **k: types.SimpleNamespace(total_memory=total, name="cpu")
    module.reset_peak_memory_stats = lambda *a, **k: None
    module.empty_cache = lambda *a, **k: None
    module.memory_stats = lambda *a, **k: {}
    return module


def cpu_device_type() -> None:
    """torchtitan.tools.utils computes ``device_type = ... or "cuda"`` at import, so a
    CPU-only host gets "cuda" and ``torch.cuda.set_device`` fails. Point it at the CPU
    (the distributed backend then follows: cpu -> gloo)."""
    import torchtitan.tools.utils as utils

    utils.device_type, utils.device_module = "cpu", _cpu_device_module()


class _Permissive:
    """Stands in for any triton attribute at import time (decorators, constexpr types)."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, key: str) -> "_Permissive":
        if key.startswith("__"):
            raise AttributeError(key)
        return _Permissive(f"{self._name}.{key}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs and not isinstance(args[0], _Permissive):
            return args[0]  # bare decorator: @triton.jit
        return _Permissive(f"{self._name}()")

    def __getitem__(self, key) -> "_Permissive":
        return _Permissive(f"{self._name}[]")


def _stub_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__getattr__ = lambda key: _Permissive(f"{name}.{key}") if not key.startswith("__") else None
    module.__version__ = "0.0.0+primus-import-stub"
    return module


def triton_import_stub() -> None:
    """torchtitan 0.3.0 imports triton unconditionally (distributed/minimal_async_ep/kernels.py)
    even for dense models; triton has no CPU wheel worth installing (~900 MB). Its kernels never
    launch on CPU, so an import-time stand-in is enough. torch's own optional ``import triton``
    checks run first and settle on "no triton"; the stand-in is removed right afterwards."""
    import torch._dynamo  # noqa: F401  (caches has_triton() = False before the stub exists)
    import torch._inductor.codecache  # noqa: F401

    triton, language = _stub_module("triton"), _stub_module("triton.language")
    triton.language = language
    sys.modules["triton"], sys.modules["triton.language"] = triton, language
    try:
        import torchtitan.distributed.minimal_async_ep  # noqa: F401
    finally:
        del sys.modules["triton"], sys.modules["triton.language"]


def set_timeout_alias() -> None:
    """torchtitan 0.3.0 calls ``torch.distributed.set_timeout``, public only from torch 2.14;
    torch 2.13 has the same function as ``distributed_c10d._set_pg_timeout``."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _set_pg_timeout

    dist.set_timeout = _set_pg_timeout


def gloo_sum_reduction() -> None:
    """TorchTitan sets FSDP's gradient divide factor to 1.0 (it normalises by the global token
    count itself), so FSDP2 reduce-scatters with ``ReduceOp.PREMUL_SUM(1.0)``, which gloo
    rejects. Forcing plain SUM is numerically identical for a factor of 1."""
    import torchtitan.distributed.fsdp as fsdp
    from torch.distributed.fsdp import FSDPModule

    original = fsdp.disable_fsdp_gradient_division
    if getattr(original, "_primus_patched", False):
        return

    def disable_division_with_sum(model) -> None:
        original(model)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)

    disable_division_with_sum._primus_patched = True
    fsdp.disable_fsdp_gradient_division = disable_division_with_sum


def checkpoint_on_transient_group() -> None:
    """TorchTitan's synchronous checkpoint save/load calls ``dcp.save``/``dcp.load`` on the default
    process group. On a CPU host (gloo) with more than one intra-op thread, the plan gathers leave
    an OpenMP thread pool in each gloo worker thread that copies them, and libgomp then throttles
    every OpenMP worker's spin-wait for the rest of the run: steps after the first checkpoint took
    ~2x as long (tiny demo, 2 cores). Each save/load now runs on its own gloo group, destroyed
    right after, which takes the pools with it (root cause: ``primus/backends/dcp_group.py``).
    Async modes keep the group TorchTitan gives them."""
    import torchtitan.components.checkpointer.dcp as checkpointer

    from primus.backends.dcp_group import route_dcp_through_transient_groups

    route_dcp_through_transient_groups(checkpointer)


def _triton_missing() -> bool:
    return importlib.util.find_spec("triton") is None


def _torch_lacks_set_timeout() -> bool:
    import torch.distributed as dist

    return not hasattr(dist, "set_timeout")


PATCHES = [
    Patch("cpu_device_type", cpu_device_type.__doc__, "torchtitan", SpecifierSet(">=0.3,<0.4"), _no_cuda,
          cpu_device_type),
    Patch("triton_import_stub", triton_import_stub.__doc__, "torchtitan", SpecifierSet(">=0.3,<0.4"),
          _triton_missing, triton_import_stub),
    Patch("set_timeout_alias", set_timeout_alias.__doc__, "torch", SpecifierSet("<2.14"),
          _torch_lacks_set_timeout, set_timeout_alias),
    Patch("gloo_sum_reduction", gloo_sum_reduction.__doc__, "torchtitan", SpecifierSet(">=0.3,<0.4"), _no_cuda,
          gloo_sum_reduction),
    Patch("checkpoint_on_transient_group", checkpoint_on_transient_group.__doc__, "torchtitan",
          SpecifierSet(">=0.3,<0.4"), _no_cuda, checkpoint_on_transient_group),
]

_applied: list[str] = []


def apply_patches() -> list[str]:
    """Apply every patch that is needed here, once per process; return their names."""
    if not _applied:
        for patch in PATCHES:
            if patch.applies():
                patch.apply()
                _applied.append(patch.name)
        _applied.append("")  # marks "done" even when nothing applied
    return [name for name in _applied if name]
