"""Admission: does the real launch of a plan start on the device it is meant for?

One step, run by every command that says yes to a run: ``config validate``, ``plan``,
``train --dry-run``, ``tools/primus_compat.py`` and the launch itself, so a dry-run that says ok
means the launch gets past this point on that device. It is run for a ``Target``
(``primus.plan.target``): the device named with ``--device`` (``mi355x``, ``h100`` ...), else this
host's own device. A named device that is not on this host is assumed to carry its standard
software (torch for ROCm / CUDA with Transformer Engine, as the training images do), and admission
says so in one line.

What is refused: the AMD Primus features the compatibility layer marked ``refuse_at_run``, and
whatever the backend's own ``admit(plan, target)`` refuses (Megatron-LM arguments this backend
cannot honour, features a target lacks per ``primus.runtime.capabilities``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from primus.config.errors import ConfigError

if TYPE_CHECKING:
    from primus.plan.target import Target  # a type only: runtime sits below plan
    from primus.runtime.adapter import BackendAdapter, EnginePlan

UNKNOWN_SOURCE = "the resolved config"  # what Provenance.describe says of a key no layer set


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
        return f"admitted on {self.target.in_full()}"


# ``primus:`` switches that change what an engine computes, honoured only by the backends whose ``honours``
# names them: set elsewhere, they would do nothing, silently
BACKEND_OPTIONS = {"sanitize_nan_grads": "zeroes NaN/Inf gradient elements in megatron-core's DDP buckets"}


def _options_not_honoured(adapter: "BackendAdapter", plan: "EnginePlan") -> list[Refusal]:
    options = plan.module.params.get("primus") or {}
    return [Refusal(f"primus.{name}", options[name], f"{options[name]!r}: {what}; the {adapter.name} backend "
                                                     "has no such step (remove it)")
            for name, what in BACKEND_OPTIONS.items() if options.get(name) and name not in adapter.honours]


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
    refusals += _options_not_honoured(adapter, plan)
    for item in adapter.admit(plan, target):
        where = item.where or (provenance.describe(f"modules.{module}.{item.key}") if provenance is not None else "")
        refusals.append(Refusal(item.key, item.value, item.message, "" if where == UNKNOWN_SOURCE else where))
    return Admission(target, module, refusals)
