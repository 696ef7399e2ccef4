"""The hardware a run is meant for, as admission reads it: this host, or a device named by the user.

One ``Target`` for every command: ``config validate``, ``plan``, ``train --dry-run``, the launch and
``tools/primus_compat.py`` admit a run against it (``primus.runtime.admission``), plans take its
dtypes (a named GPU's, never this host's CPU's), and features that need particular hardware (FP8
GEMMs, Transformer Engine's layers) ask it. ``host_target()`` reads this machine (torch's device and
compute capability, whether ``transformer_engine`` is importable); ``named_target("mi300x")`` is a
device that is not here, with the software of its standard training image assumed (the ROCm and
CUDA training images ship Transformer Engine), which ``Target.assumed`` records so admission can
say so in one line.

Compute capabilities are what ``torch.cuda.get_device_capability()`` returns on the device: the
SM version on NVIDIA, the gfx generation on AMD (gfx942 -> (9, 4), gfx950 -> (9, 5)).
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any

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
SOFTWARE = {"rocm": "ROCm", "cuda": "CUDA"}


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
    def torch_device(self) -> str:
        """What torch calls it ("cuda" on ROCm too): the ``device`` adapters plan for, so a plan for a
        GPU takes the experiment's dtypes and never this host's CPU bf16 rule."""
        return "cuda" if self.gpu else "cpu"

    @property
    def bf16(self) -> bool:
        """bf16 computed natively: every GPU Primus names; on a CPU, ``cpu_bf16_decision``."""
        if self.gpu:
            return True
        from primus.plan.devices import cpu_bf16_decision

        return cpu_bf16_decision()[0]

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
        """``a CPU host``, ``NVIDIA H100 80GB HBM3 (sm_90)``, ``mi300x (gfx942)``: for refusals."""
        return f"{self.name} ({self.arch})" if self.gpu else "a CPU host"

    def assumption(self) -> str | None:
        """The one line saying what is assumed about a named device that is not here (None when present)."""
        if not self.assumed:
            return None
        software = SOFTWARE[self.accelerator]
        return (f"not on this host: assumed to have its standard software, torch for {software} with "
                f"Transformer Engine, as in the {software} training images")

    def in_full(self) -> str:
        """What admission says it admitted on: the device and what is known or assumed of its software."""
        if not self.gpu:
            return f"{self.name} (this host's CPU)"
        if self.assumed:
            return f"{self.name} ({self.assumption()})"
        te = "present" if self.transformer_engine else "absent"
        return f"{self.name} ({SOFTWARE[self.accelerator]} {self.arch}, Transformer Engine {te})"

    def to_dict(self) -> dict[str, Any]:
        te = ("assumed" if self.assumed else "present") if self.transformer_engine else "absent"
        return {"name": self.name, "accelerator": self.accelerator, "arch": self.arch, "bf16": self.bf16,
                "transformer_engine": te, "present": not self.assumed}


def has_fp8_gemm(target: Target) -> bool:
    """FP8 tensor-core GEMMs: NVIDIA SM 8.9+ (Ada, Hopper, Blackwell), AMD gfx942+ (MI300 series, MI355X)."""
    if target.capability is None:
        return False
    return (target.accelerator == "cuda" and target.capability >= (8, 9)) or \
        (target.accelerator == "rocm" and target.capability >= (9, 4))


def named_target(device: str) -> Target | None:
    """A device by name (``mi300x``, ``NVIDIA H100 80GB HBM3``, ``cpu``); None for an unknown name."""
    name = device.strip().lower()
    if name == "cpu":
        return Target("cpu")
    key = name if name in DEVICE_ARCH else device_key(device)
    if key is None or key not in DEVICE_ARCH:
        return None
    accelerator, capability = DEVICE_ARCH[key]
    return Target(accelerator, capability, key, transformer_engine=True, assumed=True)


def _gpu_device_files() -> bool:
    """A GPU driver is visible (ROCm's /dev/kfd, NVIDIA's /dev/nvidiactl): only then is torch imported."""
    return any(os.path.exists(path) for path in ("/dev/kfd", "/dev/nvidiactl", "/dev/dxg"))


def host_target() -> Target:
    """This machine: its first accelerator (or the CPU), and whether Transformer Engine imports here."""
    if not _gpu_device_files():
        return Target("cpu")
    import torch

    if not torch.cuda.is_available():
        return Target("cpu")
    accelerator = "rocm" if torch.version.hip is not None else "cuda"
    full = torch.cuda.get_device_name()
    return Target(accelerator, tuple(torch.cuda.get_device_capability()), device_key(full) or full,
                  transformer_engine=importlib.util.find_spec("transformer_engine") is not None)


def target_for(device: str | None) -> Target:
    """The target a command is run for: ``--device NAME``, else this host's (None). The host itself
    when it is the named device; an unknown name is a user error naming the known ones."""
    if device is None:
        return host_target()
    from primus.config.errors import ConfigError, did_you_mean

    named = named_target(device)
    if named is None or not named.gpu:
        name = device.strip().lower()
        raise ConfigError(f"--device {device}: unknown device{did_you_mean(name, DEVICE_ARCH)}; "
                          f"known: {', '.join(sorted(DEVICE_ARCH))}")
    here = host_target()
    return here if here.gpu and here.name == named.name else named
