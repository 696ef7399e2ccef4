"""The module section -> TorchTitan's own ``Trainer.Config`` dataclass tree, strictly.

Every key must be a field of the engine's config object at that place (did-you-mean from
the real field names); leaf values are type-checked against the field's annotation with
pydantic's ``TypeAdapter``. Keys Primus consumes itself (``PRIMUS_KEYS``) never reach the
engine.

Primus conveniences on top of the native tree (documented in the README):
- ``model``: the neutral Llama description (``ModelSpec``, ``model.py``) or a model of TorchTitan's
  registry by ``name``/``flavor`` (``registry.py``), turned into ``model_spec``;
- ``attn_backend``: ``auto`` (SDPA on CPU, flex on GPU) | sdpa | flex | flex_flash | varlen;
- ``optimizer.{name,lr,betas,eps,weight_decay}``: one catch-all param group;
- ``activation_checkpoint.mode``: selective | full | memory_budget | none;
- ``primus``: Primus-only options (tiny_assets, peak_tflops, tensorboard).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from primus.config.errors import ConfigError, did_you_mean
from primus.plan.model import ModelSpec
from primus.config.provenance import Provenance, error_at
from primus.config.schema import validate_model
from primus.backends.torchtitan.model import ATTENTION_BACKENDS, build_model_spec
from primus.backends.torchtitan.ranges import check_ranges, non_finite_numbers
from primus.plan.target import Target

PRIMUS_KEYS = ("model", "attn_backend", "primus")
# (Trainer.Config, attention backend, fail(key, message) -> ConfigError) -> derived settings
Finish = Callable[[Any, str, Callable[[str, str], ConfigError]], list[tuple[str, Any, str]]]
OWNED_BY_PRIMUS = {"dump_folder": "the run directory", "model_spec": "the `model:` preset"}
OPTIMIZER_SHORTCUTS = ("name", "lr", "betas", "eps", "weight_decay")
AC_MODES = ("selective", "full", "memory_budget", "none")


class _OptimizerShortcuts(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "AdamW"
    lr: float = Field(gt=0, allow_inf_nan=False)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.1, ge=0)


@dataclasses.dataclass
class BuildContext:
    """Where the values came from (for messages) and what Primus decided for the user."""

    provenance: Provenance | None
    prefix: str  # "modules.pre_trainer"
    derived: list[tuple[str, Any, str]] = dataclasses.field(default_factory=list)

    def where(self, key: str) -> str:
        full = f"{self.prefix}.{key}"
        return self.provenance.describe(full) if self.provenance else full

    def fail(self, key: str, message: str) -> ConfigError:
        return error_at(self.provenance, f"{self.prefix}.{key}", message)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, include_extras=False)
    except Exception:  # forward refs under TYPE_CHECKING: skip type checks for this class
        return {}


def _accepts_bool(hint: Any) -> bool:
    if hint in (bool, Any):
        return True
    return any(_accepts_bool(arg) for arg in typing.get_args(hint)) if typing.get_origin(hint) else False


def _check_type(cls: type, name: str, value: Any, ctx: BuildContext, key: str) -> Any:
    hint = _hints(cls).get(name)
    if hint is None:
        return value
    if isinstance(value, bool) and not _accepts_bool(hint):  # pydantic's lax mode reads true as 1
        raise ctx.fail(key, f"{str(value).lower()} is a boolean; expected {getattr(hint, '__name__', hint)}")
    from pydantic import TypeAdapter, ValidationError

    try:
        adapter = TypeAdapter(hint)
    except Exception:  # annotation pydantic cannot model (engine objects): trust the engine
        return value
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        raise ctx.fail(key, f"{value!r} is not a valid {getattr(hint, '__name__', hint)}: "
                            f"{exc.errors()[0]['msg']}") from None


def apply_tree(obj: Any, data: dict[str, Any], ctx: BuildContext, path: str = "",
               errors: list[ConfigError] | None = None) -> None:
    """Set ``data`` onto the dataclass ``obj`` recursively, refusing unknown keys and wrong types: every
    mistake of the section, said together."""
    found: list[ConfigError] = [] if errors is None else errors
    fields = {f.name for f in dataclasses.fields(obj) if not f.name.startswith("_")}
    for name, value in data.items():
        key = f"{path}.{name}" if path else name
        if name not in fields:
            found.append(ctx.fail(key, f"unknown key for TorchTitan {type(obj).__qualname__}"
                                       f"{did_you_mean(name, fields)}"))
            continue
        current = getattr(obj, name)
        if dataclasses.is_dataclass(current) and isinstance(value, dict):
            apply_tree(current, value, ctx, key, found)
            continue
        try:
            setattr(obj, name, _check_type(type(obj), name, copy.deepcopy(value), ctx, key))
        except ConfigError as exc:
            found.append(exc)
    if errors is None and found:
        raise ConfigError.of_all(found)


def _model(params: dict[str, Any], attn: str, ctx: BuildContext):
    """``(TorchTitan ModelSpec, neutral ModelSpec)`` of the ``model:`` block: the neutral Llama
    keys, or a model of TorchTitan's registry by ``name`` and ``flavor`` (``registry.py``)."""
    from primus.backends.torchtitan import registry
    from primus.backends.torchtitan.plan import model_spec_from_titan

    if "model" not in params:
        raise ctx.fail("model", "missing: set `model:` in the experiment (a model preset such as llama3_tiny.yaml)")
    block = params["model"]
    if not isinstance(block, dict):
        raise ctx.fail("model", "must be a mapping: the neutral Llama keys (n_layers, dim, ...) or a TorchTitan "
                                "registry model (name, flavor)")
    block = {key: value for key, value in block.items() if key != "converters"}  # float8.py
    if not registry.is_registry_model(block):
        spec = validate_model(ModelSpec, block, ctx.provenance or Provenance(), f"{ctx.prefix}.model")
        return build_model_spec(spec, attn), spec
    if block.get("name") == "llama4":  # transformers' Llama4ForCausalLM on TorchTitan's transformers backend
        return _llama4(block, ctx)
    model = registry.parse(block, registry.validator(ctx.provenance, ctx.prefix), ctx.fail)
    titan = registry.build(model, attn, ctx.fail)
    if attn == "sdpa" and registry.has_attention_sinks(titan.model):
        ctx.derived.append(("attn_backend", "flex", f"{model.name}'s attention sinks need the softmax normaliser, "
                            "which SDPA does not return; FlexAttention has no CPU backward in torch 2.13, so this "
                            "model trains on GPU only"))
    return titan, model_spec_from_titan(titan.model, f"{model.name} {model.flavor}")


def _llama4(block: dict[str, Any], ctx: BuildContext):
    """``model: {name: llama4, flavor}`` (``llama4.py``): the flavor's Llama4TextConfig, built locally."""
    from primus.backends.torchtitan import llama4, registry

    model = registry.validator(ctx.provenance, ctx.prefix)(registry.RegistryModel, block)
    if model.flavor not in llama4.FLAVORS:
        raise ctx.fail("model.flavor", f"'{model.flavor}' is not a Llama 4 flavor"
                                       f"{registry._suggest(model.flavor, llama4.FLAVORS)}; known: "
                                       f"{', '.join(llama4.FLAVORS)}")
    allowed = ["name", "flavor", *llama4.OVERRIDES]
    for key in [*(model.model_extra or {}), *(k for k in ("load_balance_coeff",) if getattr(model, k) is not None)]:
        raise ctx.fail(f"model.{key}", f"unknown key for Llama 4{did_you_mean(key, allowed)}; known: "
                                       f"{', '.join(allowed)}")
    overrides = {key: getattr(model, key) for key in llama4.OVERRIDES}
    config = llama4.text_config(model.flavor, overrides)
    if config.num_experts_per_tok > config.num_local_experts:
        raise ctx.fail("model.top_k", f"top_k {config.num_experts_per_tok} is more than the "
                                      f"{config.num_local_experts} experts")
    return llama4.titan_spec(model.flavor, config), llama4.neutral_spec(config, model.flavor)


def _attn_backend(params: dict[str, Any], device: str, ctx: BuildContext) -> str:
    choice = params.get("attn_backend", "auto")
    if choice == "auto":
        choice = "flex" if device == "cuda" else "sdpa"
        ctx.derived.append(("attn_backend", choice, "auto: FlexAttention has no CPU backward in torch 2.13"
                            if device != "cuda" else "auto: FlexAttention on GPU"))
    if choice not in ATTENTION_BACKENDS:
        raise ctx.fail("attn_backend", f"'{choice}' is not one of auto, {', '.join(ATTENTION_BACKENDS)}"
                                       f"{did_you_mean(choice, ATTENTION_BACKENDS)}")
    return choice


def _optimizer(cfg: Any, section: dict[str, Any], ctx: BuildContext) -> dict[str, Any]:
    """Turn the flat optimizer shortcuts into one catch-all param group."""
    section = dict(section)
    shortcuts = {k: section.pop(k) for k in OPTIMIZER_SHORTCUTS if k in section}
    if shortcuts and "param_groups" in section:
        raise ctx.fail("optimizer.param_groups", "give either param_groups or the flat name/lr/... keys, not both")
    if shortcuts:
        from pydantic import ValidationError
        from torchtitan.components.optimizer import ParamGroupConfig

        try:
            checked = _OptimizerShortcuts.model_validate(shortcuts)
        except ValidationError as exc:
            error = exc.errors()[0]
            key = f"optimizer.{error['loc'][0]}"
            raise ctx.fail(key, f"{error.get('input')!r}: {error['msg']}") from None
        kwargs = {"lr": 8e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
        kwargs.update(checked.model_dump(exclude_unset=True, exclude={"name"}))
        cfg.optimizer.param_groups = [ParamGroupConfig(pattern=r".*", optimizer_name=checked.name,
                                                       optimizer_kwargs=kwargs)]
    if "param_groups" in section:
        from torchtitan.components.optimizer import ParamGroupConfig

        groups = section.pop("param_groups")
        try:
            cfg.optimizer.param_groups = [ParamGroupConfig(**group) for group in groups]
        except TypeError as exc:
            raise ctx.fail("optimizer.param_groups", str(exc)) from None
    return section


def _activation_checkpoint(cfg: Any, section: dict[str, Any], ctx: BuildContext) -> dict[str, Any]:
    from torchtitan.distributed.activation_checkpoint import FullAC, MemoryBudgetAC, SelectiveAC

    section = dict(section)
    mode = section.pop("mode", None)
    if mode is None:
        return section
    classes = {"selective": SelectiveAC.Config, "full": FullAC.Config, "memory_budget": MemoryBudgetAC.Config,
               "none": None}
    if mode not in classes:
        raise ctx.fail("activation_checkpoint.mode", f"'{mode}' is not one of {', '.join(AC_MODES)}"
                                                     f"{did_you_mean(str(mode), AC_MODES)}")
    cfg.activation_checkpoint = classes[mode]() if classes[mode] else None
    if cfg.activation_checkpoint is None and section:
        raise ctx.fail("activation_checkpoint", "mode none takes no other keys")
    return section


def build_trainer_config(params: dict[str, Any], *, run_dir: Path, device: str,
                         provenance: Provenance | None = None, prefix: str = "modules.pre_trainer",
                         dataloader: Any = None, finish: Finish | None = None):
    """Return ``(Trainer.Config, ModelSpec, derived settings)``; raises ConfigError.

    ``dataloader``: the dataloader ``Config`` the section's keys apply to (default: TorchTitan's text
    dataloader); ``finish(cfg, attn_backend, fail)``: the recipe's last word on the final values."""
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.trainer import Trainer

    from primus.backends.torchtitan.data import PrimusTextDataLoader, blend_problem

    ctx = BuildContext(provenance, prefix)
    for key in non_finite_numbers(params):
        raise ctx.fail(key, "is not a finite number (NaN and infinity are never meaningful settings)")
    for key, owner in OWNED_BY_PRIMUS.items():
        if key in params:
            raise ctx.fail(key, f"is set by Primus ({owner}); remove it")
    attn = _attn_backend(params, device, ctx)
    cfg = Trainer.Config(dataloader=dataloader if dataloader is not None else PrimusTextDataLoader.Config())
    cfg.model_spec, spec = _model(params, attn, ctx)
    if hasattr(cfg.model_spec.model, "_primus_hf_config"):  # transformers backend: its Config carries hf_model
        from primus.backends.torchtitan.hooks import PrimusHFTrainer, _as
        from primus.backends.torchtitan.llama4 import CONFIG_DIR

        cfg = _as(PrimusHFTrainer.Config, cfg)
        cfg.hf_model = str(run_dir / CONFIG_DIR)  # config.json written there when the run starts
    cfg.loss = ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=spec.vocab_size))
    native = {k: v for k, v in params.items() if k not in PRIMUS_KEYS}
    if isinstance(native.get("optimizer"), dict):
        native["optimizer"] = _optimizer(cfg, native["optimizer"], ctx)
    if isinstance(native.get("activation_checkpoint"), dict):
        native["activation_checkpoint"] = _activation_checkpoint(cfg, native["activation_checkpoint"], ctx)
        if cfg.activation_checkpoint is None:
            native.pop("activation_checkpoint")
    apply_tree(cfg, native, ctx)
    problem = blend_problem(cfg.dataloader)
    if problem:
        raise ctx.fail("dataloader.blend", problem)
    _float8(cfg, params["model"], device, ctx)
    check_ranges(cfg, ctx.fail)
    _check_parallelism(cfg, spec, ctx)
    if hasattr(cfg, "hf_model"):
        from primus.backends.torchtitan.llama4 import parallelism_problem

        problem = parallelism_problem(cfg.parallelism)
        if problem:
            raise ctx.fail(*problem)
    _derive_run_paths(cfg, run_dir, ctx)
    if device != "cuda":
        _derive_cpu_settings(cfg, ctx)  # before the engine's checks: e.g. CUDA graphs are refused with EP
    else:
        _derive_cuda_graphs(cfg, params, ctx)
    _say_bf16_experts(cfg, ctx)  # after the CPU's bf16 rule, which may have made the run fp32
    try:
        cfg.__post_init__()  # the engine's own cross-field invariants, on the final values
    except ValueError as exc:
        raise ConfigError(f"{ctx.where('training')}: {ctx.prefix}: {exc}") from None
    if finish is not None:
        ctx.derived += finish(cfg, attn, ctx.fail)
    return cfg, spec, ctx.derived


def _float8(cfg: Any, block: dict[str, Any], device: str, ctx: BuildContext) -> None:
    """``model.converters.float8``: TorchTitan's float8 converter on the model config, or on a
    transformers-backend model (Llama 4) torchao's swap of the built model's layers (``float8.py``),
    applied where this host can run it; elsewhere the run is refused before it starts (``prepare``)."""
    from primus.backends.torchtitan import float8
    from primus.plan.target import host_target

    settings = float8.parse_converters(block.get("converters"), ctx.fail)
    if settings is None:
        return
    compile_enabled = cfg.compile.enable and "model" in cfg.compile.components
    if settings.emulate and compile_enabled:
        raise ctx.fail("model.converters.float8.emulate", "true with compile.enable: torchao's emulation runs "
                                                          "in eager mode only")
    problem = float8.refusal(settings, host_target() if device == "cuda" else Target("cpu"))
    if problem:
        ctx.derived.append(("model.converters.float8", "not applied here", f"{problem}; a run here is refused"))
        return
    emulated = "; emulated" if settings.emulate else ""
    if hasattr(cfg, "hf_model"):  # Llama 4: no Linear configs to convert; the built model's layers are swapped
        count = float8.hf_linears_to_swap(cfg.model_spec.model._primus_hf_config, settings,
                                          compile_enabled=compile_enabled)
        cfg.model_spec = float8.with_hf_float8(cfg.model_spec, settings, compile_enabled=compile_enabled)
        ctx.derived.append(("model.converters.float8", f"{settings.recipe_name}, {count} Linear layers",
                            float8.HF_BACKEND_SCOPE + emulated))
        return
    cfg.model_spec.model = float8.convert(cfg.model_spec.model, settings, compile_enabled=compile_enabled)
    count = float8.converted_linears(cfg.model_spec.model)
    ctx.derived.append(("model.converters.float8", f"{settings.recipe_name}, {count} Linear layers",
                        "TorchTitan's Float8LinearConverter on torchao (Linear layers with every dim a multiple "
                        "of 16, minus filter_fqns)" + emulated))


def _say_bf16_experts(cfg: Any, ctx: BuildContext) -> None:
    """TorchTitan 0.3.0's ``GroupedExperts.forward`` casts tokens and expert weights to bf16 for its grouped
    GEMMs whatever ``mixed_precision_param`` says: an fp32 run of one of its MoE models is not fp32 in the
    routed experts (and on a CPU without bf16 units those GEMMs run many times slower than fp32 ones)."""
    if cfg.training.mixed_precision_param != "float32" or cfg.model_spec is None:
        return
    from torchtitan.models.common.moe import GroupedExperts

    if any(True for _ in cfg.model_spec.model.traverse(GroupedExperts.Config)):
        ctx.derived.append(("training.mixed_precision_param", "float32 (routed experts: bf16)",
                            "TorchTitan 0.3.0's GroupedExperts computes its grouped GEMMs in bf16 whatever the "
                            "mixed precision"))


def _check_parallelism(cfg: Any, spec: ModelSpec, ctx: BuildContext) -> None:
    """What the layout needs from the model and the batch, said before any rank starts."""
    parallel = cfg.parallelism
    ep = parallel.expert_parallel_degree
    if ep > 1 and not spec.is_moe:
        raise ctx.fail("parallelism.expert_parallel_degree",
                       f"{ep}, but the model ({spec.family}) has no experts: expert parallelism needs an MoE model "
                       "(e.g. model: {name: deepseek_v3, flavor: debugmodel}); set it to 1")
    if ep > 1 and spec.n_experts % ep:
        raise ctx.fail("parallelism.expert_parallel_degree", f"{ep} does not divide the {spec.n_experts} experts")
    if parallel.pipeline_parallel_degree > 1:
        _pipeline_microbatches(cfg, ctx)


def expert_layout_problem(parallel: dict[str, Any], world_size: int) -> str | None:
    """TorchTitan places the expert-parallel ranks inside data_parallel_shard x context x tensor (its
    ``efsdp`` mesh is that product / EP): EP must divide it. None when it does."""
    ep = parallel.get("expert_parallel_degree", 1)
    if ep <= 1:
        return None
    tp, cp = parallel.get("tensor_parallel_degree", 1), parallel.get("context_parallel_degree", 1)
    shard = parallel.get("data_parallel_shard_degree", -1)
    if shard < 1:
        outer = parallel.get("data_parallel_replicate_degree", 1) * parallel.get("pipeline_parallel_degree", 1)
        shard = max(1, world_size // (outer * tp * cp))
    inner = shard * cp * tp
    if inner % ep == 0:
        return None
    return (f"{ep} does not divide data_parallel_shard x context x tensor = {shard} x {cp} x {tp} = {inner} ranks "
            f"(world size {world_size}), inside which TorchTitan places the experts; run on {ep * cp * tp} ranks "
            "or more, or lower it")


def _pipeline_microbatches(cfg: Any, ctx: BuildContext) -> None:
    """Each pipeline stage needs a microbatch in flight: local_batch_size / microbatch_size >= stages
    (torch's 1F1B refuses fewer, the other schedules idle)."""
    parallel, batch = cfg.parallelism, cfg.training.local_batch_size
    size, stages = parallel.pipeline_parallel_microbatch_size, parallel.pipeline_parallel_degree
    if batch % size:
        raise ctx.fail("parallelism.pipeline_parallel_microbatch_size",
                       f"{size} does not divide training.local_batch_size ({batch})")
    count = batch // size
    if count < stages:
        key, fix = (("parallelism.pipeline_parallel_microbatch_size",
                     f"set parallelism.pipeline_parallel_microbatch_size to {batch // stages} or less")
                    if batch >= stages else
                    ("training.local_batch_size", f"raise training.local_batch_size to {stages * size} or more"))
        raise ctx.fail(key, f"{count} pipeline microbatch(es) of {size} for {stages} stages: every stage needs "
                            f"one; {fix}")
    ctx.derived.append(("pipeline microbatches", count, f"training.local_batch_size {batch} / "
                        f"parallelism.pipeline_parallel_microbatch_size {size}, for {stages} stages"))


def _derive_run_paths(cfg: Any, run_dir: Path, ctx: BuildContext) -> None:
    cfg.dump_folder = str(run_dir)
    if cfg.checkpoint.folder != "checkpoints":
        ctx.derived.append(("checkpoint.folder", "checkpoints", "checkpoints live in the run directory"))
    cfg.checkpoint.folder = "checkpoints"
    if cfg.metrics.log_freq != 1:
        ctx.derived.append(("metrics.log_freq", 1, "Primus reports every step"))
    cfg.metrics.log_freq = 1
    cfg.metrics.enable_tensorboard = False  # Primus writes its own event files
    cfg.metrics.disable_color_printing = True


def _derive_cpu_settings(cfg: Any, ctx: BuildContext) -> None:
    """Settings that only make sense on GPU are switched off, and said so."""
    if not cfg.training.disable_cuda_graphs:
        cfg.training.disable_cuda_graphs = True
        ctx.derived.append(("training.disable_cuda_graphs", True, "no CUDA on this host"))
    _derive_cpu_bf16(cfg, ctx)
    if cfg.checkpoint.async_mode == "async_with_pinned_mem":
        cfg.checkpoint.async_mode = "async"
        ctx.derived.append(("checkpoint.async_mode", "async", "pinned host memory needs CUDA: DCP's threaded async "
                            "save, which stages the state in CPU memory, overlaps the write the same way"))
    if cfg.optimizer.implementation in ("fused", "fused_opt_states_bf16"):
        cfg.optimizer.implementation = "foreach"
        ctx.derived.append(("optimizer.implementation", "foreach", "fused AdamW kernels are CUDA-only"))
    if cfg.parallelism.spmd_backend == "spmd_types" and not hasattr(cfg, "hf_model"):
        # (the transformers backend, Llama 4, runs only on spmd_types: kept, one rank on CPU)
        cfg.parallelism.spmd_backend = "partial_dtensor"
        ctx.derived.append(("parallelism.spmd_backend", "partial_dtensor",
                            "spmd_types fails with >1 rank on torch 2.13 CPU"))


def _derive_cuda_graphs(cfg: Any, params: dict[str, Any], ctx: BuildContext) -> None:
    """CUDA graphs are on by default in TorchTitan 0.3.0 (TorchTitan 0.2, which AMD Primus's files are
    written for, had none), and its own check refuses them with pipeline parallelism or an expert-parallel
    token dispatcher that synchronizes with the CPU. Unless the experiment asked for them, they are
    switched off there, said in one line (the same math; TorchTitan's check asks for exactly this)."""
    if cfg.training.disable_cuda_graphs or "disable_cuda_graphs" in (params.get("training") or {}):
        return
    try:
        cfg._validate_cuda_graphs()
    except ValueError as exc:
        cfg.training.disable_cuda_graphs = True
        ctx.derived.append(("training.disable_cuda_graphs", True, f"TorchTitan 0.3.0: {str(exc).split('. ')[0]}"))


def _derive_cpu_bf16(cfg: Any, ctx: BuildContext) -> None:
    """bf16 on CPU (FSDP2's ``MixedPrecisionPolicy``, which TorchTitan installs even on one rank, or
    full-bf16 ``training.dtype``) is kept where the CPU has bf16 units (AMX-BF16 / AVX512-BF16); on
    one without, oneDNN emulates bf16 slower than fp32, so fp32 is derived, said in one line."""
    from primus.plan.devices import cpu_bf16_decision

    asked = [key for key, value in (("training.mixed_precision_param", cfg.training.mixed_precision_param),
                                    ("training.dtype", cfg.training.dtype)) if value == "bfloat16"]
    if not asked:
        return
    keep, reason = cpu_bf16_decision()
    if keep:
        return
    for key in asked:
        section, name = key.split(".")
        setattr(getattr(cfg, section), name, "float32")
        ctx.derived.append((key, "float32", reason))
