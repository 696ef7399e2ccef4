"""Is a module written in AMD Primus's format? Decided from what the experiment's own files carry.

AMD Primus's experiment files and Primus's share their shape and their preset names
(``config: pre_trainer.yaml``, ``model: llama3.1_8B.yaml``), so the names cannot tell them apart. What
does: an AMD Primus-only key among the module's ``overrides`` (``stderr_sink_level``,
``disable_last_saving``, ``enable_primus_turbo``, an environment variable's name, a TorchTitan 0.2
spelling, ...): a key a compat table covers, less the keys both formats write (``SHARED``). Every AMD
Primus example at fd1eeab for Megatron and TorchTitan carries one.

AMD Primus's NeMo AutoModel pretraining files carry none (their overrides are batch sizes, the cache dir,
activation checkpointing: AutoModel's own keys, Primus's too). What marks them is their shape: AMD Primus's
module has no ``stage:`` key (AutoModel's ``model.mode`` picks pretrain or finetune), every Primus example
writes one, and they name a model preset AMD Primus ships for that framework (generated into
``primus/configs/models/<framework>/amd/``: AutoModel's ``wan2_2_t2v_a14b.yaml``). A module with both is
read as AMD Primus's; a Primus Wan experiment that writes ``stage:`` keeps Primus's presets.

A module in AMD Primus's format is resolved as AMD Primus resolves it: AMD's module presets
(``primus/configs/modules/<framework>/amd/``), its module preset winning over its model preset (AMD
Primus's ``merge_namespace(module_config, model_config, allow_override=False)``), and the keys AMD Primus
drops dropped (``norm_epsilon``), each said in a ``differs:`` line.
"""
from __future__ import annotations

from typing import Any

# Keys a compat table covers that a Primus experiment may write too, meaning the same: no marker.
SHARED = frozenset({
    "stage", "norm_epsilon", "apply_layernorm_1p", "tokenizer_type", "fp4_recipe", "lora",  # Megatron
    "sft_conversation_format",
    "model.converters", "activation_checkpoint.mode", "activation_checkpoint.selective_ac_option",  # TorchTitan
    "float8.*", "mx.*",
    "model.mode", "wandb.enable", "checkpoint.checkpoint_dir",  # AutoModel
})


def amd_marker(framework: str, overrides: dict[str, Any] | None) -> str | None:
    """The first AMD Primus-only key among ``overrides`` (dotted), or None: a Primus-format module."""
    from primus.compat import common
    from primus.compat.tables import TABLES
    from primus.compat.translate import covered

    rules = {**common.RULES, **TABLES.get(framework, {})}
    for dotted, rule, _ in covered(overrides or {}, rules):
        if rule.key not in SHARED:
            return dotted
    return None


def amd_shape(framework: str, model: str | None, stage_explicit: bool) -> str | None:
    """``modules.<m>.model`` when the module has AMD Primus's shape without an AMD-only key: no ``stage:``
    written and a model preset AMD Primus ships (its generated copy under ``models/<framework>/amd/``)."""
    from primus.config.presets import CONFIGS_ROOT

    if stage_explicit or not model or "/" in model:
        return None
    name = model if model.endswith((".yaml", ".yml")) else f"{model}.yaml"
    return "model" if (CONFIGS_ROOT / "models" / framework / "amd" / name).is_file() else None


def unread_top_level(experiment: dict[str, Any], known: set[str]) -> dict[str, Any]:
    """The top-level keys AMD Primus's parser never reads, removed from ``experiment`` and returned, when
    one of its modules is in AMD Primus's format: AMD Primus reads a module's settings under
    ``modules.<name>`` only, so its ``modules:``-less LoRA file (``extends:`` the SFT file, then ``lora:``,
    ``lr:`` ... at the top) trains the SFT file's settings. A Primus file keeps its unknown-key error."""
    modules = experiment.get("modules")
    if not isinstance(modules, dict) or not any(
            isinstance(m, dict) and amd_marker(str(m.get("framework")), m.get("overrides")) for m in modules.values()):
        return {}
    return {key: experiment.pop(key) for key in [k for k in experiment if k not in known]}


def unread_lines(unread: dict[str, Any], where: dict[str, str], module: str, params: dict[str, Any]) -> list:
    """One ``differs:`` record per unread top-level key: what the module runs instead."""
    from primus.compat.rules import Translation

    return [Translation(key, value, f"modules.{module}.{key}", "a top-level key: AMD Primus reads a module's "
                        "settings under modules.<name> only, as here; move it there to set it", "differs",
                        where.get(key, ""), params.get(key, "its default")) for key, value in unread.items()]
