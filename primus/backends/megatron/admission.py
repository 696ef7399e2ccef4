"""Admission of Megatron-LM arguments on a target: which of the experiment's arguments a run can honour.

Every argument the experiment set (``args.given``) to a value other than Megatron-LM's default is
looked at once:

- an argument (or a value of one) whose support depends on the device maps onto a row of
  ``primus.runtime.capabilities`` (``FEATURES``, ``VALUE_FEATURES``): the row decides per target;
- FP8 and context parallelism: ``te_features.refusal`` (their rows, then each FP8 recipe's hardware);
- otherwise ``support.classify`` decides: refused on every target, or kernel-only (accepted, said
  in one ``derived`` line by the trainer), or implemented;
- an implemented argument with a value this backend does not run (``support.SUPPORTED_VALUES``)
  is refused.

``config validate``, ``plan``, ``train --dry-run`` and the launch all call ``refusals`` through the
adapter (``primus.runtime.admission``); the trainer calls ``check_arguments`` for the notes it logs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from primus.backends.megatron import te_features
from primus.backends.megatron.schema import megatron_lm_table
from primus.backends.megatron.support import (IMPLEMENTED_KIND, KERNEL_ONLY_KIND, REFUSED_KIND, SAID_BY_TRAINER,
                                              SUPPORTED_VALUES, classify)
from primus.runtime.admission import Refusal
from primus.runtime.capabilities import refusal

if TYPE_CHECKING:
    from primus.plan.target import Target
    from primus.runtime.adapter import EnginePlan

# Megatron-LM arguments whose admission depends on the target: dest -> row of primus.runtime.capabilities.
FEATURES: dict[str, str] = {
    # FP8 and context parallelism (rows megatron.fp8 / megatron.context_parallel) with their recipes: te_features
    **dict.fromkeys(("fp4", "fp4_recipe", "fp4_param", "fp4_quantizer_factory"), "megatron.fp4"),
    **dict.fromkeys(("use_torch_fsdp2", "torch_fsdp2_reshard_after_forward"), "megatron.torch_fsdp2"),
    **dict.fromkeys(("use_megatron_fsdp", "data_parallel_sharding_strategy"), "megatron.megatron_fsdp"),
    **dict.fromkeys(("use_precision_aware_optimizer", "main_grads_dtype", "main_params_dtype", "exp_avg_dtype",
                     "exp_avg_sq_dtype"), "megatron.precision_aware_optimizer"),
}
# Each row's switch: the row's other arguments have no effect while it is at Megatron-LM's default.
SWITCHES: dict[str, str] = {
    "megatron.fp4": "fp4",
    "megatron.torch_fsdp2": "use_torch_fsdp2", "megatron.megatron_fsdp": "use_megatron_fsdp",
    "megatron.precision_aware_optimizer": "use_precision_aware_optimizer",
}
# Values whose admission depends on the target: (dest, value) -> row.
VALUE_FEATURES: dict[tuple[str, Any], str] = {
    ("ckpt_format", "torch"): "megatron.ckpt_format.torch",
    ("ckpt_format", "torch_dcp"): "megatron.ckpt_format.torch_dcp",
    ("ckpt_format", "fsdp_dtensor"): "megatron.ckpt_format.fsdp_dtensor",
}

Note = tuple[str, Any, str]  # (key, value, reason) of a derived line


def _same(value: Any, default: Any) -> bool:
    norm = lambda v: list(v) if isinstance(v, tuple) else v  # noqa: E731
    if isinstance(value, list) and len(value) == 1 and not isinstance(default, list):
        value = value[0]  # a one-item list for a nargs argument whose default is a scalar
    return norm(value) == norm(default)


def _reads_or_writes_checkpoints(args) -> bool:
    """Whether a checkpoint in ``ckpt_format`` is ever written or read (Primus's own run-dir
    checkpoints are torch_dist whatever the format says)."""
    return bool(args.save or args.load or args.pretrained_checkpoint)


def _refused(value: Any, default: Any, on: str, why: str) -> str:
    return (f"{value!r} cannot be honoured on {on} ({why}); ignoring it would change the run, so training "
            f"stops (remove it or set it to Megatron-LM's default, {default!r})")


def check_arguments(args, target: "Target") -> tuple[list[Refusal], list[Note]]:
    """(refusals, notes) for the arguments the experiment set, on ``target``; once per process and
    target (the launcher's admission, then an in-process worker's trainer, ask the same arguments)."""
    return args.once(("admission", target), lambda: _check_arguments(args, target))


def _check_arguments(args, target: "Target") -> tuple[list[Refusal], list[Note]]:
    refusals: list[Refusal] = []
    notes: list[Note] = []
    table = megatron_lm_table()
    if problem := te_features.refusal(args, args.given, target):
        dest, reason = problem
        refusals.append(Refusal(dest, getattr(args, dest), f"{getattr(args, dest)!r} cannot run on "
                                                           f"{target.describe()} ({reason})"))
    for dest in table:
        if dest not in args.given:
            continue
        value, default = getattr(args, dest), table[dest].default
        support = classify(dest)
        if support.kind == IMPLEMENTED_KIND and dest in SUPPORTED_VALUES:
            values, why = SUPPORTED_VALUES[dest]
            if value not in values:
                supported = ", ".join(repr(v) for v in sorted(values, key=str) if v is not None)
                refusals.append(Refusal(dest, value, f"{value!r} cannot be run on {target.name} ({why}); "
                                                     f"supported: {supported}"))
                continue
        feature = VALUE_FEATURES.get((dest, value)) if isinstance(value, str) else None
        if feature is not None:
            if not _reads_or_writes_checkpoints(args):
                notes.append((dest, value, "save, load and pretrained_checkpoint are null: no checkpoint in this "
                                           "format is written or read (the run directory's own are torch_dist)"))
            elif why := refusal(feature, target):
                refusals.append(Refusal(dest, value, f"{value!r} cannot be run on {target.name} ({why})"))
            continue
        if _same(value, default):
            continue
        if dest in FEATURES:
            switch = SWITCHES[FEATURES[dest]]
            if dest != switch and _same(getattr(args, switch), table[switch].default):
                notes.append((dest, value, f"no effect without {switch} (Megatron-LM reads it only then)"))
            elif why := refusal(FEATURES[dest], target):
                refusals.append(Refusal(dest, value, _refused(value, default, target.name, why)))
            continue
        if dest.startswith("muon_") and "muon" not in str(args.optimizer):  # AMD's module presets say 0.95
            notes.append((dest, value, f"accepted, no effect here: read only with optimizer muon "
                                       f"({args.optimizer} runs)"))
            continue
        if support.kind == REFUSED_KIND:
            refusals.append(Refusal(dest, value, _refused(value, default, target.name, support.reason)))
        elif support.kind == KERNEL_ONLY_KIND and dest not in SAID_BY_TRAINER:
            notes.append((dest, value, f"accepted, no effect here: {support.reason}"))
    changed = {d for d in args.given if d in table and not _same(getattr(args, d), table[d].default)}
    return refusals, notes + te_features.inert_notes(args, changed)


def admit(plan: "EnginePlan", target: "Target") -> list[Refusal]:
    """The adapter's ``admit``: what the launch of ``plan`` on ``target`` would refuse."""
    return check_arguments(plan.engine_config, target)[0] + _sanitize_refusals(plan)


def _sanitize_refusals(plan: "EnginePlan") -> list[Refusal]:
    """``primus.sanitize_nan_grads`` cleans megatron-core's DDP gradient buckets (``option_patches.py``); with
    FSDP there are none: the switch would do nothing, silently."""
    args = plan.engine_config
    fsdp = [dest for dest in ("use_torch_fsdp2", "use_megatron_fsdp") if getattr(args, dest, False)]
    if not fsdp or not (plan.module.params.get("primus") or {}).get("sanitize_nan_grads"):
        return []
    return [Refusal("primus.sanitize_nan_grads", True, f"True cannot be honoured with {fsdp[0]} (it cleans "
                                                       "megatron-core's DDP gradient buckets; FSDP has none)")]
