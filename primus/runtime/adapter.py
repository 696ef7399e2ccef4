"""The backend contract: an adapter (what Primus knows of an engine) and its recipes (one per stage).

A module's route through it::

    adapter.plan(module)     the recipe its stage names in ``adapter.recipes`` builds an EnginePlan:
                             pure — computes only (no file written, nothing registered, no patch)
    [admission]              does the plan fit the device it is about to run on (before prepare)
    recipe.prepare(plan)     the launcher, once per node before any rank: tiny assets, instruction
                             sets, Hub downloads; idempotent, file-locked
    recipe.run(plan, ctx)    each rank: the engine's own trainer, every step reported through ``ctx``
    recipe.export(plan)      a run's checkpoint as Hugging Face tensors

The launcher builds the plan once (``config validate``, ``plan``, ``preflight``, ``--dry-run`` and
the launch read the same one); each worker rebuilds the identical plan from ``config.resolved.yaml``
(which holds what ``prepare`` localised), or takes the launcher's own when it runs in its process.
"""
from __future__ import annotations

import importlib
import importlib.metadata
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar

from primus.config.errors import ConfigError

if TYPE_CHECKING:
    from primus.config.provenance import Provenance
    from primus.plan.sizing import Sizing
    from primus.plan.target import Target
    from primus.runtime.admission import Refusal
    from primus.runtime.context import RunContext

ConfigT = TypeVar("ConfigT")  # the engine's own config object
ModelT = TypeVar("ModelT")  # the network: primus.plan.model.ModelSpec (LLMs) or primus.plan.diffusion.WanSpec (Wan)
LayoutT = TypeVar("LayoutT")  # how it is split: ParallelLayout (LLMs) or DiffusionLayout


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

    @property
    def prefix(self) -> str:
        """The dotted prefix of this module's keys in messages: ``modules.<name>``."""
        return f"modules.{self.name}"


@dataclass(frozen=True)
class Derived:
    """A setting Primus chose for the user, said once at run time with its reason."""

    key: str
    value: Any
    reason: str


@dataclass(frozen=True)
class CheckpointSpec:
    """Where a run saves, what it starts from, and how the engine names its checkpoints."""

    directory: Path  # this run's checkpoints (``<run dir>/checkpoints`` unless the engine config says so)
    load: str | None = None  # a checkpoint to start from (not the run's own: that is ``resume``)
    format: Literal["native", "hf"] = "native"
    # the engine's name of one saved step, its step number the first group (TorchTitan ``step-(\d+)``,
    # Megatron ``iter_(\d+)``); None where Primus does not verify the engine's checkpoints itself
    step_pattern: str | None = None
    # another engine's checkpoint under this engine's step name, said (``runtime.checkpoints.problem_of``)
    foreign: "Callable[[Path], str | None] | None" = None


@dataclass
class EnginePlan(Generic[ConfigT, ModelT, LayoutT]):
    """Everything a launch, its ranks and ``export`` need to know about one module, built once.

    An engine's recipes may subclass it to carry their own typed facts (Megatron: the HF start,
    the instruction data, the LoRA adapters) so that ``run`` and ``export`` never re-read params.
    """

    module: ModuleConfig
    recipe: "Recipe"  # the table row that built the plan, and runs it
    world_size: int | None  # None: not known yet (``config validate`` outside a launch)
    engine_config: ConfigT  # TorchTitan Trainer.Config, Megatron arguments, the AutoModel hand-off dict
    checkpoint: CheckpointSpec
    model: ModelT | None = None  # the network; None where it is unknown before the run (a Hub model)
    layout: LayoutT | None = None
    sizing: "Sizing[ModelT, LayoutT] | None" = None  # how `primus plan` and preflight size model on layout
    flops_per_token: float | None = None  # training FLOPs per token, primus.plan.flops convention (LLMs)
    derived: list[Derived] = field(default_factory=list)

    def derive(self, key: str, value: Any, reason: str) -> Any:
        self.derived.append(Derived(key, value, reason))
        return value

    def log_derived(self, ctx: "RunContext") -> None:
        for item in self.derived:
            ctx.log_derived(item.key, item.value, item.reason)


# -- recipes: one per (engine, stage) ----------------------------------------------------------------
@dataclass
class HFWeights:
    """A run's checkpoint as Hugging Face tensors, and what ``export`` writes beside them."""

    tensors: dict[str, Any]  # HF names -> tensors, at their full (unsharded) shapes
    model: Any  # the primus.plan.model.ModelSpec they follow
    source: Path | None  # the HF folder the run started from (its config.json is kept), else None
    tokenizer: str | None  # the tokenizer folder to copy beside the weights
    checkpoint: Path  # the checkpoint directory read
    step: int


class Recipe(ABC):
    """How one engine runs one stage (pretrain, sft, finetune; lora around either), as torchtune keeps
    ``full_finetune_distributed.py`` and ``lora_finetune_distributed.py`` apart: plan (pure) ->
    [admission] -> prepare (launcher) -> run (ranks) -> export. A recipe IS its stage: it never asks
    which stage it runs. A new stage (DPO, say) is a new recipe file and a row in its adapter's table.
    """

    stage: ClassVar[str]  # the table row this recipe is (``pretrain``, ``sft``, ``finetune``, ``lora``)
    # what this recipe's run uses that a compatibility patch's condition may ask for (``primus.runtime.patches``)
    patch_uses: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, adapter: "BackendAdapter"):
        self.adapter = adapter

    def defaults(self) -> dict[str, Any]:
        """The lowest-precedence layer of a module section of this stage (plain YAML-able data)."""
        return {}

    def derived_params(self, params: dict[str, Any]) -> list[tuple[str, Any, str]]:
        """What Primus sets in ``params`` itself, at resolve time (``config show --why`` tells)."""
        return []

    @abstractmethod
    def plan(self, module: ModuleConfig, world_size: int | None, provenance: "Provenance | None" = None, *,
             run_dir: Path | None = None, device: str = "cpu") -> EnginePlan:
        """Validate ``module`` against the engine's own config objects and compute its plan.

        Pure: reads files (a checkpoint's config.json) but writes none, registers nothing into the
        engine's tables, applies no patch. What ``prepare`` will build is described, not built."""

    def describe(self, module: ModuleConfig, world_size: int | None, provenance: "Provenance | None" = None, *,
                 device: str = "cpu") -> EnginePlan | None:
        """A plan without the engine's config (no engine import: ``primus plan`` stays fast), holding the
        model and layout the recipe can tell on its own; None where only the engine can tell."""
        return None

    def admit(self, plan: EnginePlan, target: "Target") -> "list[Refusal]":
        """What the launch of ``plan`` on ``target`` would refuse (``primus.runtime.admission``): settings
        the engine accepts but this recipe cannot run there. Empty: admitted. Asked by validate, plan,
        --dry-run and the launch alike."""
        return []

    def check_inputs(self, plan: EnginePlan, provenance: "Provenance | None" = None) -> None:
        """The files the run reads (data, tokenizer, checkpoints to load) exist and fit the model.
        Called before launching; ``primus config validate --check-paths`` calls it too."""

    def resume_problem(self, plan: EnginePlan, resuming: bool) -> str | None:
        """Why the checkpoint this plan would start from cannot be loaded at the plan's layout (a layout
        change the engine cannot reshard), or None. Checked before any rank starts."""
        return None

    def prepare(self, plan: EnginePlan, log: Callable[[str], None]) -> list[Derived]:
        """The launcher's one-time work before any rank starts (idempotent, file-locked): build the
        tiny assets the plan names, fetch what it names by Hub id. Returns what it localised (a
        param -> its local copy); the launcher saves those values for the workers and re-plans."""
        return []

    @abstractmethod
    def run(self, plan: EnginePlan, ctx: "RunContext") -> None:
        """Build the engine's trainer from ``plan`` and train, reporting every step through ``ctx``."""

    def export(self, plan: EnginePlan, step: int | None, warn: Callable[[str], None] | None = None) -> HFWeights:
        """The run's checkpoint (``step``, else the latest whole one: each newer damaged one said
        through ``warn``) as Hugging Face tensors."""
        raise ConfigError(f"{plan.module.prefix}: a {self.adapter.name} {self.stage} run does not export to a "
                          "Hugging Face model")


class WrappingRecipe(Recipe):
    """A mode that changes another recipe (LoRA around pretrain or sft): every member goes to ``base``
    unless the mode overrides it."""

    def __init__(self, adapter: "BackendAdapter", *, base: Recipe):
        super().__init__(adapter)
        self.base = base
        self.patch_uses = base.patch_uses

    def defaults(self) -> dict[str, Any]:
        return self.base.defaults()

    def derived_params(self, params: dict[str, Any]) -> list[tuple[str, Any, str]]:
        return self.base.derived_params(params)

    def plan(self, module: ModuleConfig, world_size: int | None, provenance: "Provenance | None" = None, *,
             run_dir: Path | None = None, device: str = "cpu") -> EnginePlan:
        plan = self.base.plan(module, world_size, provenance, run_dir=run_dir, device=device)
        plan.recipe = self
        return plan

    def describe(self, module: ModuleConfig, world_size: int | None, provenance: "Provenance | None" = None, *,
                 device: str = "cpu") -> EnginePlan | None:
        return None  # the mode changes the plan: the engine's

    def admit(self, plan: EnginePlan, target: "Target") -> "list[Refusal]":
        return self.base.admit(plan, target)

    def check_inputs(self, plan: EnginePlan, provenance: "Provenance | None" = None) -> None:
        self.base.check_inputs(plan, provenance)

    def resume_problem(self, plan: EnginePlan, resuming: bool) -> str | None:
        return self.base.resume_problem(plan, resuming)

    def prepare(self, plan: EnginePlan, log: Callable[[str], None]) -> list[Derived]:
        return self.base.prepare(plan, log)

    def run(self, plan: EnginePlan, ctx: "RunContext") -> None:
        self.base.run(plan, ctx)

    def export(self, plan: EnginePlan, step: int | None, warn: Callable[[str], None] | None = None) -> HFWeights:
        return self.base.export(plan, step, warn)


# -- the adapter: one per engine --------------------------------------------------------------------
class BackendAdapter:
    """What Primus knows of one engine: its distribution, how to check it imports, and which recipe
    runs each stage. Engine imports stay inside methods (``primus --help`` imports no engine)."""

    name: ClassVar[str]
    distribution: ClassVar[str]  # the pip distribution whose version we report
    extra: ClassVar[str]  # `pip install primus[<extra>]` / `primus prepare <extra>` (requirements/<extra>.txt)
    # a module whose import proves the installed engine works with this torch (None: skip the probe)
    import_probe: ClassVar[str | None] = None
    # THE recipe table of this engine: stage -> "module:Class" (imported when chosen). A row named
    # ``lora`` wraps the stage's own recipe when the section asks for adapters (``wants_lora``).
    recipes: ClassVar[Mapping[str, str]]
    stage_aliases: ClassVar[Mapping[str, str]] = {"train": "pretrain"}
    # modules exposing ``register(actions)`` that add this backend's ``primus data`` commands
    data_commands: ClassVar[tuple[str, ...]] = ()
    # plan() reads Primus's own tables only (no engine import): `config validate --no-engine` plans
    plans_without_engine: ClassVar[bool] = False
    # the module listing this engine's compatibility ``PATCHES`` and ``params_uses`` (``primus patches``)
    patches: ClassVar[str | None] = None
    # ``primus:`` switches that only some engines honour (``BACKEND_OPTIONS``), honoured by this one
    honours: ClassVar[frozenset[str]] = frozenset()

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages a module may name (the ``lora`` row is chosen by the section, not by name)."""
        return tuple(stage for stage in self.recipes if stage != "lora")

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
        """Import ``import_probe``: an engine built against another torch (torchtitan 0.3.0 on
        torch 2.11 misses a torch API) is one clear line, not a traceback."""
        if not self.import_probe:
            return
        from primus.logs.setup import engine_output_to_log

        try:
            with engine_output_to_log():  # import-time banners (diffusers on torchao): debug.log, not the console
                self.import_module(self.import_probe)
        except ImportError as exc:
            import torch

            raise ConfigError(
                f"backend '{self.name}': {self.distribution} {self.installed_version()} does not import with torch "
                f"{torch.__version__} ({exc}); install the pinned versions (requirements/{self.extra}.txt, "
                f"`primus prepare {self.extra}`)"
            ) from None

    def import_module(self, name: str) -> Any:
        """Import one of the engine's modules. An engine that needs a shim merely to import on this
        host (TorchTitan: triton on a CPU) overrides this; nothing it does outlives the import."""
        return importlib.import_module(name)

    def canonical_stage(self, stage: str, where: str = "stage") -> str:
        stage = self.stage_aliases.get(stage, stage)
        if stage not in self.stages:
            raise ConfigError(
                f"{where}: stage '{stage}' is not supported by backend '{self.name}'; "
                f"supported: {', '.join(self.stages)}"
            )
        return stage

    def wants_lora(self, params: Mapping[str, Any]) -> bool:
        """Does the section ask for LoRA adapters (then the ``lora`` row runs, around its stage's recipe)?"""
        return False

    def recipe(self, stage: str, params: Mapping[str, Any] | None = None) -> "Recipe":
        """The dispatch: the recipe the table names for ``stage`` (canonical), or the ``lora`` row
        wrapped around it when ``params`` ask for adapters. The only place a stage is looked at."""
        recipe = self._load(stage)(self)
        if params is not None and "lora" in self.recipes and self.wants_lora(params):
            recipe = self._load("lora")(self, base=recipe)
        return recipe

    def _load(self, row: str) -> type:
        module, _, name = self.recipes[row].partition(":")
        return getattr(importlib.import_module(module), name)

    def defaults(self, stage: str) -> dict[str, Any]:
        """The lowest-precedence layer of a module section of ``stage`` (plain YAML-able data)."""
        return self.recipe(stage).defaults()

    def derived_params(self, params: dict[str, Any], stage: str) -> list[tuple[str, Any, str]]:
        """What the backend sets itself from ``params`` (e.g. ``primus.tiny_assets`` paths), as
        ``(dotted key, value, reason)``; resolution applies it last and records it as derived."""
        return self.recipe(self.stage_aliases.get(stage, stage), params).derived_params(params)

    def plan(self, module: ModuleConfig, world_size: int | None, provenance: "Provenance | None" = None, *,
             run_dir: Path | None = None, device: str = "cpu") -> EnginePlan:
        """``module``'s plan, by the recipe of its stage: every key validated against the engine's
        own config objects, each mistake a ``ConfigError`` naming the dotted key and where it was set.
        With ``world_size`` the layout is checked against it; ``run_dir`` and ``device`` are the
        worker's (the launcher plans for its own host)."""
        from primus.config.provenance import Provenance
        from primus.config.schema import PrimusOptions, validate_model

        validate_model(PrimusOptions, module.params.get("primus") or {}, provenance or Provenance(),
                       f"{module.prefix}.primus")
        stage = self.canonical_stage(module.stage, f"{module.prefix}.stage")
        return self.recipe(stage, module.params).plan(module, world_size, provenance, run_dir=run_dir, device=device)

    def describe(self, module: ModuleConfig, world_size: int | None, provenance: "Provenance | None" = None, *,
                 device: str = "cpu") -> tuple["ModelSpec | None", "ParallelLayout | None"]:
        """The neutral (model, layout) ``primus plan`` estimates; an adapter that can tell them without
        importing its engine overrides this (``plan`` stays fast)."""
        plan = self.plan(module, world_size, provenance, device=device)
        return plan.model, plan.layout

    def describe(self, module: ModuleConfig, world_size: int | None, provenance: "Provenance | None" = None, *,
                 device: str = "cpu") -> EnginePlan:
        """``module``'s plan as ``primus plan`` needs it: its recipe's engine-free description where it has
        one (``Recipe.describe``), else the engine's own plan."""
        from primus.config.provenance import Provenance
        from primus.config.schema import PrimusOptions, validate_model

        validate_model(PrimusOptions, module.params.get("primus") or {}, provenance or Provenance(),
                       f"{module.prefix}.primus")
        stage = self.canonical_stage(module.stage, f"{module.prefix}.stage")
        described = self.recipe(stage, module.params).describe(module, world_size, provenance, device=device)
        return described if described is not None else self.plan(module, world_size, provenance, device=device)

    def admit(self, plan: EnginePlan, target: "Target") -> "list[Refusal]":
        """What the launch of ``plan`` on ``target`` would refuse (``primus.runtime.admission``), by its recipe."""
        return plan.recipe.admit(plan, target)

    def resume_problem(self, plan: EnginePlan, resuming: bool) -> str | None:
        """Why the checkpoint ``plan`` would start from cannot be loaded at its layout, by its recipe."""
        return plan.recipe.resume_problem(plan, resuming)

    def run(self, plan: EnginePlan, ctx: "RunContext") -> None:
        """Train ``plan`` on this rank (by the recipe that built it)."""
        plan.recipe.run(plan, ctx)

    def prepare(self, plan: EnginePlan, log: Callable[[str], None]) -> list[Derived]:
        """The launcher's one-time work before any rank starts; what it localised (see ``Recipe.prepare``)."""
        return plan.recipe.prepare(plan, log)
