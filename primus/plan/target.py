"""The hardware a run is meant for, as admission reads it: this host, or a device named by the user.

Features that need particular hardware (FP8 GEMMs, Transformer Engine's layers) are admitted
against a ``Target``. ``host_target()`` reads this machine (torch's device and compute capability,
whether ``transformer_engine`` is importable); ``named_target("mi300x")`` is a device that is not
here, with the software of its standard training image assumed (the ROCm and CUDA training images
ship Transformer Engine), which ``Target.assumed`` records so admission can say so.

Compute capabilities are what ``torch.cuda.get_device_capability()`` returns on the device: the
SM version on NVIDIA, the gfx generation on AMD (gfx942 -> (9, 4), gfx950 -> (9, 5)).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from primus.plan.devices import device_key

# device key (primus.plan.devices) -> (accelerator, compute capability), from the vendors' data sheets
DEVICE_ARCH: dict[str, tuple[str, tuple[int, int]]] = {
    "a100": ("cuda", (8, 0)),
    "h100": ("cuda", (9, 0)),
    "h200": ("cuda", (9, 0)),
    "b200": ("cuda", (10, 0)),
    "mi300x": ("rocm", (9, 4)),
    "mi325x": ("rocm", (9, 4)),
    "mi355x": ("rocm", (9, 5)),
}

_GFX = {(9, 0): "gfx90a", (9, 4): "gfx942", (9, 5): "gfx950"}  # AMD Instinct MI200 / MI300 / MI355


@dataclass(frozen=True)
class Target:
    """Where a run goes: ``accelerator`` is cpu | cuda | rocm."""

    accelerator: str
    capability: tuple[int, int] | None = None
    name: str = "cpu"
    transformer_engine: bool = False  # importable there (or assumed, for a named device)
    assumed: bool = False  # a named device that is not this host: its standard image's software assumed

    @property
    def gpu(self) -> bool:
        return self.accelerator in ("cuda", "rocm")

    @property
    def arch(self) -> str:
        """``sm_90`` / ``gfx942`` / ``cpu`` (``?`` where the capability is unknown)."""
        if not self.gpu:
            return "cpu"
        if self.capability is None:
            return "?"
        major, minor = self.capability
        if self.accelerator == "cuda":
            return f"sm_{major}{minor}"
        return _GFX.get(self.capability, f"gfx{major}{minor}x")

    def describe(self) -> str:
        """``a CPU host``, ``NVIDIA H100 80GB HBM3 (sm_90)``, ``mi300x (gfx942)``."""
        return f"{self.name} ({self.arch})" if self.gpu else "a CPU host"


def has_fp8_gemm(target: Target) -> bool:
    """FP8 tensor-core GEMMs: NVIDIA SM 8.9+ (Ada, Hopper, Blackwell), AMD gfx942+ (MI300 series, MI355X)."""
    if target.capability is None:
        return False
    return (target.accelerator == "cuda" and target.capability >= (8, 9)) or \
        (target.accelerator == "rocm" and target.capability >= (9, 4))


def named_target(device: str) -> Target | None:
    """A device by name (``mi300x``, ``NVIDIA H100 80GB HBM3``, ``cpu``); None for an unknown name."""
    if device.strip().lower() == "cpu":
        return Target("cpu")
    key = device_key(device)
    if key is None or key not in DEVICE_ARCH:
        return None
    accelerator, capability = DEVICE_ARCH[key]
    return Target(accelerator, capability, key, transformer_engine=True, assumed=True)


def host_target() -> Target:
    """This machine: its first accelerator (or the CPU), and whether Transformer Engine imports here."""
    import torch

    if not torch.cuda.is_available():
        return Target("cpu")
    accelerator = "rocm" if torch.version.hip is not None else "cuda"
    return Target(accelerator, tuple(torch.cuda.get_device_capability()), torch.cuda.get_device_name(),
                  transformer_engine=importlib.util.find_spec("transformer_engine") is not None)
