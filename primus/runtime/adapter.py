"""The backend adapter contract: the one seam between Primus and a training engine.

An adapter turns a resolved module section into the engine's own config objects, runs the
engine's own trainer, and reports each step through ``RunContext.report_step``. Primus owns
config, launch, logs and metrics; the engine owns the model, data, optimizer and checkpoints.
"""
from __future__ import annotations

import importlib
import importlib.metadata
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from primus.config.errors import ConfigError

if TYPE_CHECKING:
    from primus.config.provenance import Provenance
    from primus.runtime.context import RunContext


@dataclass(frozen=True)
class ModuleConfig:
    """One resolved module section (e.g. ``pre_trainer``), identical on every rank.

    ``params`` is the merged tree: backend defaults < module preset < model preset <
    experiment overrides < command line.
    """

    name: str
    framework: str
    stage: str
    params: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, module: Any, stage: str | None = None) -> "ModuleConfig":
        """From a ``primus.config.resolve.ResolvedModule`` (optionally with its canonical stage)."""
        return cls(module.name, module.framework, stage or module.stage, module.params)


class BackendAdapter(ABC):
    """What every engine backend implements. Keep engine imports inside methods."""

    name: ClassVar[str]
    distribution: ClassVar[str]  # the pip distribution whose version we report
    extra: ClassVar[str]  # `pip install primus[<extra>]` / `primus prepare <extra>`
    # a module whose import proves the installed engine works with this torch (None: skip the probe)
    import_probe: ClassVar[str | None] = None
    stages: ClassVar[tuple[str, ...]] = ("pretrain",)
    stage_aliases: ClassVar[dict[str, str]] = {}

    def installed_version(self) -> str | None:
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None

    def require_installed(self) -> str:
        version = self.installed_version()
        if version is None:
            raise ConfigError(
                f"backend '{self.name}' needs {self.distribution}, which is not installed: "
                f"run `primus prepare {self.extra}` (or `pip install primus[{self.extra}]`)"
            )
        return version

    def import_engine(self) -> None:
        """Import ``import_probe`` (after the backend's patches): an engine built against another
        torch (torchtitan 0.3.0 on torch 2.11 misses a torch API) is one clear line, not a traceback."""
        if not self.import_probe:
            return
        try:
            importlib.import_module(self.import_probe)
        except ImportError as exc:
            import torch

            raise ConfigError(
                f"backend '{self.name}': {self.distribution} {self.installed_version()} does not import with torch "
                f"{torch.__version__} ({exc}); install the pinned versions (requirements/{self.extra}.txt, "
                f"`primus prepare {self.extra}`)"
            ) from None

    def canonical_stage(self, stage: str, where: str = "stage") -> str:
        stage = self.stage_aliases.get(stage, stage)
        if stage not in self.stages:
            raise ConfigError(
                f"{where}: stage '{stage}' is not supported by backend '{self.name}'; "
                f"supported: {', '.join(self.stages)}"
            )
        return stage

    def defaults(self, stage: str) -> dict[str, Any]:
        """The lowest-precedence layer of the module section (plain YAML-able data)."""
        return {}

    def prepare(self, module: ModuleConfig, log: Callable[[str], None]) -> None:
        """One-time work in the launching process before any rank starts (e.g. building the
        local demo assets a tiny example points at). Must be idempotent."""

    @abstractmethod
    def validate(self, module: ModuleConfig, provenance: "Provenance") -> None:
        """Check ``module.params`` against the engine's own config objects.

        Raise ``ConfigError`` naming the dotted key (``provenance.describe(key)`` gives the
        file:line that set it) with a did-you-mean where possible. May import the engine.
        """

    def check_world_size(self, module: ModuleConfig, world_size: int, provenance: "Provenance") -> None:
        """Check the parallel layout against the job's world size before any process starts."""

    def check_inputs(self, module: ModuleConfig, provenance: "Provenance") -> None:
        """Check that the files the run reads (data, tokenizer, checkpoints to load) exist.
        Called before launching; ``primus config validate --check-paths`` calls it too."""

    @abstractmethod
    def run(self, module: ModuleConfig, ctx: "RunContext") -> None:
        """Build the engine's trainer from ``module`` and train, reporting every step."""
