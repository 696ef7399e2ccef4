"""Admission: does the real launch of a plan start on the device it is meant for?

One step, run by every command that says yes to a run: ``config validate``, ``plan``,
``train --dry-run``, ``tools/primus_compat.py`` and the launch itself, so a dry-run that says ok
means the launch gets past this point on that device. It is run for a ``Target``: the device
named with ``--device`` (``mi355x``, ``h100`` ...), else this host's own device. A named device that
is not on this host is assumed to carry its standard software (torch for ROCm / CUDA with
Transformer Engine, as the training images do), and admission says so in one line.

What is refused: the AMD Primus features the compatibility layer marked ``refuse_at_run``, and
whatever the backend's own ``admit(plan, target)`` refuses (Megatron-LM arguments this backend
cannot honour, features a target lacks per ``primus.runtime.capabilities``).
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from primus.config.errors import ConfigError

if TYPE_CHECKING:
    from primus.runtime.adapter import BackendAdapter, EnginePlan

Kind = Literal["cpu", "cuda", "rocm"]
UNKNOWN_SOURCE = "the resolved config"  # what Provenance.describe says of a key no layer set
SOFTWARE = {"rocm": "ROCm", "cuda": "CUDA"}


@dataclass(frozen=True)
class Target:
    """The device a run is meant for, and what it is known (or assumed) to have."""

    name: str  # a device key (mi355x, h100 ...), "cpu", or the local GPU's own name
    kind: Kind
    bf16: bool  # bf16 is computed natively (a GPU; a CPU with AMX-BF16 / AVX512-BF16, or PRIMUS_CPU_BF16=force)
    transformer_engine: Literal["present", "assumed", "absent"]
    present: bool  # on this host; False: named with --device and assumed

    @property
    def gpu(self) -> bool:
        return self.kind != "cpu"

    @property
    def torch_device(self) -> str:
        """What torch calls it ("cuda" on ROCm too): the ``device`` adapters plan for."""
        return "cuda" if self.gpu else "cpu"

    @property
    def has_transformer_engine(self) -> bool:
        return self.transformer_engine != "absent"

    def assumption(self) -> str | None:
        """The one line saying what is assumed about a named device that is not here (None when present)."""
        if self.present:
            return None
        software = SOFTWARE[self.kind]
        return (f"not on this host: assumed to have its standard software, torch for {software} with "
                f"Transformer Engine, as in the {software} training images")

    def describe(self) -> str:
        if not self.gpu:
            return f"{self.name} (this host's CPU)"
        if not self.present:
            return f"{self.name} ({self.assumption()})"
        return f"{self.name} ({SOFTWARE[self.kind]}, Transformer Engine {self.transformer_engine})"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "bf16": self.bf16,
                "transformer_engine": self.transformer_engine, "present": self.present}


def _gpu_device_files() -> bool:
    """A GPU driver is visible (ROCm's /dev/kfd, NVIDIA's /dev/nvidiactl): only then is torch asked."""
    return any(os.path.exists(path) for path in ("/dev/kfd", "/dev/nvidiactl", "/dev/dxg"))


def _transformer_engine() -> Literal["present", "absent"]:
    return "present" if importlib.util.find_spec("transformer_engine") is not None else "absent"


def local_target() -> Target:
    """This host's device: its first GPU as torch sees it, else the CPU."""
    if _gpu_device_files():
        import torch

        if torch.cuda.is_available():
            from primus.plan.devices import device_key

            full = torch.cuda.get_device_name(0)
            kind: Kind = "rocm" if getattr(torch.version, "hip", None) else "cuda"
            return Target(device_key(full) or full, kind, bool(torch.cuda.is_bf16_supported()),
                          _transformer_engine(), present=True)
    from primus.plan.devices import cpu_bf16_decision

    return Target("cpu", "cpu", cpu_bf16_decision()[0], "absent", present=True)


def target_for(device: str | None) -> Target:
    """The target a command is run for: ``--device NAME``, else this host's device (None).
    An unknown name is a user error naming the known ones."""
    if device is None:
        return local_target()
    from primus.config.errors import did_you_mean
    from primus.plan.devices import DEVICE_KIND, device_key

    name = device.strip().lower()
    name = name if name in DEVICE_KIND else device_key(device) or name  # "AMD Instinct MI300X" too
    if name not in DEVICE_KIND:
        raise ConfigError(f"--device {device}: unknown device{did_you_mean(name, DEVICE_KIND)}; "
                          f"known: {', '.join(sorted(DEVICE_KIND))}")
    local = local_target()
    if local.gpu and local.name == name:
        return local
    return Target(name, DEVICE_KIND[name], True, "assumed", present=False)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Refusal:
    """One setting the target cannot run: the module-relative key, its value, the sentence why."""

    key: str
    value: Any
    message: str  # what follows ``modules.<module>.<key>: `` in the error line
    where: str = ""  # file:line (or command-line token) that set it

    def line(self, module: str) -> str:
        return f"{self.where + ': ' if self.where else ''}modules.{module}.{self.key}: {self.message}"


@dataclass
class Admission:
    """What admission decided for one module on one target."""

    target: Target
    module: str
    refusals: list[Refusal] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.refusals

    def error(self) -> str:
        """The one line a refused launch prints: the first refusal, then the keys of the others."""
        first = self.refusals[0].line(self.module)
        rest = sorted({r.key for r in self.refusals[1:]} - {self.refusals[0].key})
        return first + (f" (also refused on {self.target.name}: {', '.join(rest)})" if rest else "")

    def check(self) -> "Admission":
        if self.refusals:
            raise ConfigError(self.error())
        return self

    def summary(self) -> str:
        """One line for validate / plan / dry-run output (an assumed device says what is assumed)."""
        return f"admitted on {self.target.describe()}"


def admit(adapter: "BackendAdapter", plan: "EnginePlan", target: Target, translations: list = (),
          provenance: Any = None) -> Admission:
    """Admission of ``plan`` on ``target``: the compatibility layer's run-time refusals, then the backend's."""
    from primus.runtime.capabilities import refusal

    module = plan.module.name
    refusals = []
    for translation in translations:
        if translation.kind != "refuse_at_run":
            continue
        feature = getattr(translation, "feature", None)
        why = refusal(feature, target) if feature else translation.why
        if why:
            refusals.append(Refusal(translation.source, translation.value,
                                    f"{translation.value!r}: {why} (AMD Primus option; refused on {target.name})",
                                    translation.where))
    for item in adapter.admit(plan, target):
        where = item.where or (provenance.describe(f"modules.{module}.{item.key}") if provenance is not None else "")
        refusals.append(Refusal(item.key, item.value, item.message, "" if where == UNKNOWN_SOURCE else where))
    return Admission(target, module, refusals)
