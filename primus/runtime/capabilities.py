"""What each target supports: the one table admission consults for features that depend on the device.

A row names a feature of an engine and what a target needs to run it:

- ``ANY``: every target (CPU included);
- ``GPU``: a CUDA or ROCm GPU;
- ``GPU_TE``: a GPU with Transformer Engine (present on this host, or assumed for a named device
  that is not: the ROCm / CUDA training images carry it);
- ``NOWHERE``: Primus does not run it yet on any device (the row says why, in one line).

Wiring a feature is a one-word change of its row (``NOWHERE`` -> ``GPU_TE``, say): every command that
admits a run (``config validate``, ``plan``, ``train --dry-run``, the launch, ``tools/primus_compat.py``)
reads this table through each backend's ``admission`` module, which maps engine keys onto these rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from primus.plan.target import Target

Needs = Literal["any", "gpu", "gpu+te", "nowhere"]
ANY: Needs = "any"
GPU: Needs = "gpu"
GPU_TE: Needs = "gpu+te"
NOWHERE: Needs = "nowhere"


@dataclass(frozen=True)
class Capability:
    needs: Needs
    what: str  # the feature, in the words of a refusal
    why_not: str = "not wired in Primus yet, on any device"  # said while ``needs`` is NOWHERE


CAPABILITIES: dict[str, Capability] = {
    # -- Megatron (primus/backends/megatron/admission.py maps Megatron-LM arguments onto these rows)
    # FP8 and context parallelism run in Transformer Engine's layers; which FP8 recipe runs on which GPU is
    # Transformer Engine's own rule (primus/backends/megatron/te_features.py: RECIPE_HARDWARE)
    "megatron.fp8": Capability(GPU_TE, "FP8 training through Transformer Engine"),
    "megatron.fp4": Capability(NOWHERE, "FP4 training through Transformer Engine",
                               "not wired to megatron-core's Transformer Engine layers in Primus yet, on any device"),
    "megatron.context_parallel": Capability(GPU_TE, "context parallelism (Transformer Engine attention)"),
    "megatron.torch_fsdp2": Capability(ANY, "megatron-core's TorchFullyShardedDataParallel (use_torch_fsdp2)"),
    # megatron-core 0.16's Megatron-FSDP gathers and reduce-scatters on CUDA streams, its buffers on a CUDA device
    "megatron.megatron_fsdp": Capability(GPU, "Megatron FSDP (use_megatron_fsdp, megatron-core's megatron_fsdp)"),
    "megatron.ckpt_format.torch": Capability(ANY, "Megatron-LM's legacy checkpoint layout (ckpt_format: torch)"),
    "megatron.ckpt_format.torch_dcp": Capability(NOWHERE, "torch DCP checkpoints (ckpt_format: torch_dcp)"),
    "megatron.ckpt_format.fsdp_dtensor": Capability(ANY, "Megatron-FSDP's DCP checkpoints (ckpt_format: fsdp_dtensor)"),
    "megatron.precision_aware_optimizer": Capability(
        GPU_TE, "megatron-core's precision-aware optimizer (on Transformer Engine's FusedAdam)"),
    # -- TorchTitan (primus/backends/torchtitan/admission.py)
    # torchao's float8 GEMMs: FP8 units on a GPU, torch's CPU _scaled_mm, or its emulation anywhere; the converter's
    # own check says which (primus/backends/torchtitan/float8.py: refusal)
    "torchtitan.float8": Capability(ANY, "float8 training through TorchTitan's Float8 converter (torchao)"),
    "torchtitan.mx": Capability(NOWHERE, "MX (mxfp8 / mxfp4) training through TorchTitan's MX converter (torchao)"),
}


Lack = Literal["nowhere", "gpu", "transformer_engine"]


def missing(feature: str, target: "Target") -> Lack | None:
    """What ``target`` lacks to run ``feature`` (None: nothing)."""
    needs = CAPABILITIES[feature].needs
    if needs == NOWHERE:
        return "nowhere"
    if needs in (GPU, GPU_TE) and not target.gpu:
        return "gpu"
    if needs == GPU_TE and not target.transformer_engine:
        return "transformer_engine"
    return None


def refusal(feature: str, target: "Target") -> str | None:
    """Why ``target`` cannot run ``feature`` (one clause), or None when it can."""
    row = CAPABILITIES[feature]
    lack = missing(feature, target)
    if lack == "nowhere":
        return f"{row.what}: {row.why_not}"
    if lack == "gpu":
        return f"{row.what} needs a GPU{' with Transformer Engine' if row.needs == GPU_TE else ''}; " \
               f"target {target.name} is a CPU"
    if lack == "transformer_engine":
        return f"{row.what} needs Transformer Engine, which is not importable on this {target.name} host " \
               f"({INSTALL_TE}; the ROCm / CUDA training images carry it)"
    return None


INSTALL_TE = "`primus prepare megatron --with-te` installs it"
