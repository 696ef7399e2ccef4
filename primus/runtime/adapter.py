"""The backend adapter contract: the one seam between Primus and a training engine.

An adapter turns a resolved module section into an ``EnginePlan`` — the engine's own config
object plus the neutral facts every other part of Primus reads (model, parallel layout,
checkpoint, derived settings) — and runs the engine's own trainer from that plan. The plan is
built ONCE per process: by the launcher (``config validate``, ``plan``, ``preflight``,
``train --dry-run`` and the launch all read the same one) and rebuilt identically by each worker
from ``config.resolved.yaml``. Each step goes back to Primus through ``RunContext`` (report a
step, should stop — which also means "save now").
"""
from __future__ import annotations

import importlib
import importlib.metadata
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from primus.config.errors import ConfigError

if TYPE_CHECKING:
    from primus.config.provenance import Provenance
    from primus.plan.layout import ParallelLayout
    from primus.plan.target import Target
    from primus.runtime.admission import Refusal
    from primus.plan.model import ModelSpec
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


@dataclass(frozen=True)
class Derived:
    """A setting Primus chose for the user, said once at run time with its reason."""

    key: str
    value: Any
    reason: str


@dataclass(frozen=True)
class CheckpointSpec:
    """Where a run saves, what it starts from, and in which format that source is."""

    directory: Path  # this run's checkpoints (``<run dir>/checkpoints`` unless the engine config says so)
    load: str | None = None  # a checkpoint to start from (not the run's own: that is ``resume``)
    format: Literal["native", "hf"] = "native"


@dataclass
class EnginePlan:
    """Everything a launch needs to know about one module, built once by its adapter."""

    module: ModuleConfig
    world_size: int | None  # None: not known yet (``config validate`` outside a launch)
    engine_config: Any  # TorchTitan Trainer.Config, Megatron arguments, the AutoModel hand-off dict
    checkpoint: CheckpointSpec
    model: "ModelSpec | None" = None  # the neutral network (LLMs); None where planning has no model
    layout: "ParallelLayout | None" = None
    derived: list[Derived] = field(default_factory=list)
    flops_per_token: float | None = None  # training FLOPs per token, primus.plan.flops convention

    def derive(self, key: str, value: Any, reason: str) -> Any:
        self.derived.append(Derived(key, value, reason))
        return value

    def log_derived(self, ctx: "RunContext") -> None:
        for item in self.derived:
            ctx.log_derived(item.key, item.value, item.reason)


class BackendAdapter(ABC):
    """What every engine backend implements. Keep engine imports inside methods."""

    name: ClassVar[str]
    distribution: ClassVar[str]  # the pip distribution whose version we report
    extra: ClassVar[str]  # `pip install primus[<extra>]` / `primus prepare <extra>` (requirements/<extra>.txt)
    # a module whose import proves the installed engine works with this torch (None: skip the probe)
    import_probe: ClassVar[str | None] = None
    stages: ClassVar[tuple[str, ...]] = ("pretrain",)
    stage_aliases: ClassVar[dict[str, str]] = {}
    # modules exposing ``register(actions)`` that add this backend's ``primus data`` commands
    data_commands: ClassVar[tuple[str, ...]] = ()

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
        from primus.logs.setup import engine_output_to_log

        try:
            with engine_output_to_log():  # import-time banners (diffusers on torchao): debug.log, not the console
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

    @abstractmethod
    def plan(self, module: ModuleConfig, world_size: int | None, provenance: "Provenance | None" = None, *,
             run_dir: Path | None = None, device: str = "cpu") -> EnginePlan:
        """Validate ``module`` against the engine's own config objects and build its plan.

        Every user mistake is a ``ConfigError`` naming the dotted key and where it was set
        (``provenance.describe(key)``). With ``world_size`` the layout is checked against it.
        ``run_dir`` and ``device`` are the worker's (the launcher plans for its own host).
        """

    def describe(self, module: ModuleConfig, world_size: int | None, provenance: "Provenance | None" = None, *,
                 device: str = "cpu") -> tuple["ModelSpec | None", "ParallelLayout | None"]:
        """The neutral (model, layout) ``primus plan`` estimates; an adapter that can tell them without
        importing its engine overrides this (``plan`` stays fast)."""
        plan = self.plan(module, world_size, provenance, device=device)
        return plan.model, plan.layout

    def admit(self, plan: EnginePlan, target: "Target") -> "list[Refusal]":
        """What the launch of ``plan`` on ``target`` would refuse (``primus.runtime.admission``): settings
        the engine accepts but this backend cannot run there. Empty: admitted."""
        return []

    def check_inputs(self, plan: EnginePlan, provenance: "Provenance | None" = None) -> None:
        """Check that the files the run reads (data, tokenizer, checkpoints to load) exist.
        Called before launching; ``primus config validate --check-paths`` calls it too."""

    def resume_problem(self, plan: EnginePlan, resuming: bool) -> str | None:
        """Why the checkpoint this plan would start from cannot be loaded at the plan's layout (a layout
        change the engine cannot reshard), or None. Checked before any rank starts."""
        return None

    def prepare(self, plan: EnginePlan, log: Callable[[str], None]) -> None:
        """One-time work in each node's launcher before any rank starts (e.g. building the local
        demo assets a tiny example points at). Must be idempotent."""

    @abstractmethod
    def run(self, plan: EnginePlan, ctx: "RunContext") -> None:
        """Build the engine's trainer from ``plan`` and train, reporting every step through ``ctx``."""
