"""TorchTitan 0.2 spellings (what AMD Primus pins: 73a0e69's ``JobConfig``) -> TorchTitan 0.3.0's
``Trainer.Config`` names, and AMD Primus's own TorchTitan keys.

Read from AMD Primus fd1eeab ``primus/configs/modules/torchtitan/{pre_trainer,quantize}.yaml`` and
``primus/configs/models/torchtitan/*.yaml``; the 0.3.0 names from the installed torchtitan
(``torchtitan.trainer.Trainer.Config`` and the component configs it holds). Keys whose name did
not change (``training.steps``, ``lr_scheduler.*``, ``checkpoint.*``, ...) need no rule, nor does
``model: {name, flavor}``: the TorchTitan backend reads a registry model by those keys, as 0.2 did.
"""
from __future__ import annotations

from typing import Any

from primus.compat import differs
from primus.compat.rules import custom, inert, kernel, rename, table, unsupported

TT02 = "TorchTitan 0.2 name"
TURBO = "Primus-Turbo kernel switch"
BETAS = ("optimizer.beta1", "optimizer.beta2")
MOCK = "mock"  # primus/backends/torchtitan/mock_data.py (compat sits below the backends: the name, not the import)
# AMD Primus's pre_trainer.yaml values that act only beside another key, so its generated copy in our names
# (primus/configs/modules/torchtitan/amd/pre_trainer.yaml) cannot hold them: the rules below read them.
# tools/gen_module_presets.py checks them against AMD's file.
AMD_PRESET = {"training.dataset": "c4", "activation_checkpoint.selective_ac_option": "2"}


def _betas(value: Any, ctx, key: str) -> None:
    """``beta1`` / ``beta2`` -> ``betas``, both at once (the second key says it joined the first)."""
    done = [t for t in ctx.translations if t.source in BETAS and t.target == "optimizer.betas"]
    if done:
        ctx.joined(key, value, done[0], f"{TT02}: beta1/beta2 are betas")
        return
    betas = list(ctx.get("optimizer.betas") or (0.9, 0.95))
    for index, name in enumerate(BETAS):
        if name in ctx.amd:
            betas[index] = ctx.amd[name]
    ctx.set(key, betas, "optimizer.betas", f"{TT02}: beta1/beta2 are betas")


# TorchTitan 0.3.0's AC policy fields: harmless beside ``mode: none`` (0.2 files carry them).
AC_FIELDS = ("preserve_rng_state", "determinism_check", "debug", "force_recompute_mm_shapes_by_fqns",
             "memory_budget", "visualize_memory_budget_pareto")


def _ac_mode(value: Any, ctx, key: str) -> None:
    """``mode`` is ours too; ``mode: none`` drops the policy keys beside it (0.3.0 would refuse them). In AMD
    Primus's format ``mode: selective`` without ``selective_ac_option`` is AMD's default option, layer-wise,
    which TorchTitan 0.3.0 no longer has: the per-op policy runs, said in a ``differs:`` line."""
    ctx.params.setdefault("activation_checkpoint", {})["mode"] = value
    if value == "none":
        section = ctx.params["activation_checkpoint"]
        for sibling in [k for k in section if k in AC_FIELDS]:
            ctx.note(f"activation_checkpoint.{sibling}", section.pop(sibling), "activation checkpointing is off")
    option = "activation_checkpoint.selective_ac_option"
    if value == "selective" and ctx.amd_format and option not in ctx.amd and AMD_PRESET[option] != "op":
        differs.record(ctx, option, AMD_PRESET[option], key, "selective (per-op)",
                       f"AMD Primus's default option with mode: selective (its pre_trainer.yaml): layer-wise, "
                       f"one layer in {AMD_PRESET[option]}; TorchTitan 0.3.0's selective AC is per-op only", at=key)


def _selective_option(value: Any, ctx, key: str) -> None:
    mode = ctx.amd.get("activation_checkpoint.mode", ctx.get("activation_checkpoint.mode"))
    if mode in (None, "none", "full"):
        ctx.note(key, value, f"read only with mode: selective (mode is {mode})")
    elif str(value) == "op":
        ctx.note(key, value, "TorchTitan 0.3.0's SelectiveAC is the per-op policy")
    else:
        raise ctx.fail(key, f"layer-wise selective AC ('{value}') is gone in TorchTitan 0.3.0: use mode: "
                            f"selective (per-op) or mode: full")


def _recompute_fqns(value: Any, ctx, key: str) -> None:
    if ctx.amd.get("activation_checkpoint.mode", ctx.get("activation_checkpoint.mode")) in (None, "none", "full"):
        ctx.note(key, value, "read only with mode: selective")
        return
    ctx.set(key, value, "activation_checkpoint.force_recompute_mm_shapes_by_fqns", TT02)


# TorchTitan 0.2 / 0.1 names of its float8 converter (0.3.0 names converters by class: float8.py)
FLOAT8_CONVERTERS = ("quantize.linear.float8", "float8")


# TorchTitan 0.2 module names -> 0.3.0's, for float8's filter_fqns (0.3.0 calls the output head lm_head)
RENAMED_MODULES = {"output": "lm_head"}


def _converters(value: Any, ctx, key: str) -> None:
    """``model.converters``: ours is a mapping (``{float8: {...}}``, checked by the backend; AMD's
    ``quantize.linear.float8`` settings beside it are applied to it); AMD's is a list of 0.2 names."""
    if isinstance(value, dict):
        settings = _float8_settings(ctx, value.get("float8")) if "float8" in value else None
        if settings is None or settings == value["float8"]:
            ctx.params.setdefault("model", {})["converters"] = value
        else:
            ctx.set(key, {**value, "float8": settings}, "model.converters",
                    "quantize.linear.float8's TorchTitan 0.2 settings on the float8 converter")
        return
    names = [value] if isinstance(value, str) else list(value or [])
    other = [n for n in names if n not in FLOAT8_CONVERTERS and n != "primus_turbo"]
    if other:
        # MX ("mx", "quantize.grouped_mm.mx") is a row of primus.runtime.capabilities, refused per target
        feature = "torchtitan.mx" if all(n.split(".")[-1] == "mx" for n in other) else None
        ctx.note(key, value, f"model converters {', '.join(other)} are not wired to TorchTitan 0.3.0's "
                             "converters here (float8 is)", kind="refuse_at_run", feature=feature)
    elif any(n in FLOAT8_CONVERTERS for n in names):
        ctx.set(key, {"float8": _float8_settings(ctx, {})}, "model.converters",
                "TorchTitan 0.2 converter name; settings from quantize.linear.float8, a null recipe_name is "
                "0.2's tensorwise" + ("; primus_turbo: stock kernels" if "primus_turbo" in names else ""))
    elif names:
        ctx.note(key, value, f"{TURBO} (model converter)", kind="kernel")
    else:
        ctx.note(key, value, "no model converters")


def _float8_settings(ctx, ours: dict[str, Any] | None) -> dict[str, Any]:
    """``ours`` (the float8 converter's fields) with TorchTitan 0.2's settings applied. 0.2 built torchao's
    tensorwise config when ``recipe_name`` was null (and honoured ``emulate`` only then)."""
    old = {k.split(".", 1)[1]: v for k, v in ctx.amd.items() if k.startswith("float8.")}  # TorchTitan 0.1
    settings = {**old, **((ctx.amd.get("quantize.linear") or {}).get("float8") or {})}
    out: dict[str, Any] = {**(ours or {})}
    if settings.get("recipe_name") or "recipe_name" not in out:
        out["recipe_name"] = settings.get("recipe_name") or "tensorwise"
    if settings.get("filter_fqns"):
        out["filter_fqns"] = [RENAMED_MODULES.get(name, name) for name in settings["filter_fqns"]]
    if settings.get("emulate") and not settings.get("recipe_name"):
        out["emulate"] = True
    return out


def _amd_mock_default(ctx) -> bool:
    """The module trains on AMD Primus's mock data by its AMD module preset's default (``mock_data: true``,
    there ``dataloader.dataset: mock``), not by a key of the experiment's own."""
    source = ctx.last_source("dataloader.dataset")
    return (ctx.amd_format and ctx.get("dataloader.dataset") == MOCK and source is not None
            and source.label.startswith("module preset"))


def _mock_data(value: Any, ctx, key: str) -> None:
    """AMD Primus's ``mock_data: true`` replaces ``datasets.load_dataset`` (its ``mock_hf_dataset`` patch):
    mock tokens whatever ``training.dataset`` names. ``false`` reads ``training.dataset``, AMD's preset's
    (``AMD_PRESET``) when the file names none."""
    if value:
        ctx.set(key, MOCK, "dataloader.dataset", "AMD Primus's mock data: its random-integer text samples, as "
                                                 "TorchTitan dataset 'mock' (primus/backends/torchtitan/mock_data.py)")
    elif "training.dataset" not in ctx.amd and _amd_mock_default(ctx):
        ctx.set(key, AMD_PRESET["training.dataset"], "dataloader.dataset",
                "mock data off: AMD Primus's training.dataset (its pre_trainer.yaml)")
    else:
        ctx.note(key, value, "data comes from dataloader.dataset")


def _dataset(value: Any, ctx, key: str) -> None:
    """``training.dataset`` is ``dataloader.dataset``, read only when mock data is off (``_mock_data``)."""
    mock = ctx.amd.get("training.mock_data")
    if mock or (mock is None and _amd_mock_default(ctx)):
        ctx.note(key, value, "not read: training.mock_data is true" + ("" if mock else " (AMD Primus's default)")
                 + ": mock tokens replace any dataset, as in AMD Primus; set training.mock_data: false to train on it")
        return
    ctx.set(key, value, "dataloader.dataset", TT02)


def _custom_import(value: Any, ctx, key: str) -> None:
    if value:
        raise ctx.fail(key, "custom imports are not loaded by Primus (a TorchTitan 0.3.0 model goes in a "
                            "model preset)")
    ctx.note(key, value, "no custom import")


def _quantize(value: Any, ctx, key: str) -> None:
    """``quantize.*``: AMD's float8 / MX settings; only a converter listed in model.converters uses them."""
    ctx.note(key, value, "its float8 recipe_name, filter_fqns and emulate go to model.converters.float8 when a "
                         "float8 converter is set; TorchTitan 0.3.0 has no float8 all-gather / scale-precompute "
                         "switches and no MX settings here")


RULES = table(
    # -- job / model (0.2 model presets) -------------------------------------------------------
    inert("job.dump_folder", "the run directory is {workspace}/{work_group}/{user_name}/{exp_name}"),
    inert("job.description", "the experiment's exp_name names the run"),
    inert("job.config_file", "the experiment file is the config"),
    inert("job.use_for_integration_test", "TorchTitan CI switch"),
    rename("job.print_config", "debug.print_config", TT02),
    rename("job.print_args", "debug.print_config", TT02),
    rename("model.hf_assets_path", "hf_assets_path", TT02),
    rename("model.tokenizer_path", "hf_assets_path", f"{TT02} (tokenizer directory)"),
    custom("model.converters", "model converters", _converters),
    inert("model.print_after_conversion", "TorchTitan 0.2 debug print"),
    # -- training / data -----------------------------------------------------------------------
    custom("training.dataset", "dataset (read with mock data off)", _dataset),
    rename("training.dataset_path", "dataloader.dataset_path", TT02),
    custom("training.mock_data", "AMD Primus mock data", _mock_data),
    rename("training.compile", "compile.enable", TT02),
    rename("training.seed", "debug.seed", TT02),
    rename("training.deterministic", "debug.deterministic", TT02),
    # -- optimizer -----------------------------------------------------------------------------
    custom("optimizer.beta1", "Adam beta1", _betas),
    custom("optimizer.beta2", "Adam beta2", _betas),
    unsupported("optimizer.early_step_in_backward", "optimizer-in-backward is gone in TorchTitan 0.3.0"),
    # -- activation checkpointing --------------------------------------------------------------
    custom("activation_checkpoint.mode", "activation checkpointing mode", _ac_mode),
    custom("activation_checkpoint.selective_ac_option", "selective AC policy", _selective_option),
    custom("activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns", "SAC force-recompute list",
           _recompute_fqns),
    inert("activation_checkpoint.early_stop", "TorchTitan 0.3.0 does not stop recomputation early"),
    # -- profiling, validation, parallelism ----------------------------------------------------
    rename("profiling.*", "profiler.*", TT02),
    rename("validation.enable", "validator.enable", TT02),
    rename("validation.freq", "validator.freq", TT02),
    rename("validation.steps", "validator.steps", TT02),
    rename("validation.dataset", "validator.dataloader.dataset", TT02),
    rename("validation.dataset_path", "validator.dataloader.dataset_path", TT02),
    inert("validation.local_batch_size", "TorchTitan 0.3.0 validates with the training batch size"),
    inert("validation.seq_len", "TorchTitan 0.3.0 validates with the training sequence length"),
    rename("parallelism.enable_async_tensor_parallel", "compile.enable_async_tensor_parallel", TT02),
    unsupported("parallelism.expert_tensor_parallel_degree", "expert tensor parallelism is gone in TorchTitan "
                "0.3.0 (experts are sharded by expert_parallel_degree)", off=(None, 1)),
    inert("parallelism.disable_loss_parallel", "TorchTitan 0.3.0 decides loss parallelism itself"),
    inert("parallelism.context_parallel_rotate_method", "TorchTitan 0.3.0 chooses the CP load balancer "
                                                        "(parallelism.context_parallel_load_balancer)"),
    inert("parallelism.enable_compiled_autograd", "gone in TorchTitan 0.3.0"),
    # -- sections TorchTitan 0.3.0 dropped -----------------------------------------------------
    inert("memory_estimation.*", "TorchTitan 0.2 memory estimation: use `primus plan`"),
    unsupported("fault_tolerance.enable", "TorchFT fault tolerance is not wired in Primus (use --max-restarts)"),
    inert("fault_tolerance.*", "read only with fault_tolerance.enable"),
    custom("experimental.custom_import", "custom import", _custom_import),
    inert("experimental.custom_args_module", "AMD Primus's TorchTitan config extension"),
    custom("quantize.*", "low-precision settings", _quantize),
    custom("float8.*", "low-precision settings", _quantize),
    custom("mx.*", "low-precision settings", _quantize),
    # -- Primus-Turbo (AMD kernels): same math, stock kernels here -----------------------------
    kernel("primus_turbo.*", TURBO),
)
