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
    from primus.runtime.admission import Target

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


_TE_LAYERS = "not wired to megatron-core's Transformer Engine layers in Primus yet, on any device"

CAPABILITIES: dict[str, Capability] = {
    # -- Megatron (primus/backends/megatron/admission.py maps Megatron-LM arguments onto these rows)
    "megatron.fp8": Capability(NOWHERE, "FP8 training through Transformer Engine", _TE_LAYERS),
    "megatron.fp4": Capability(NOWHERE, "FP4 training through Transformer Engine", _TE_LAYERS),
    "megatron.context_parallel": Capability(NOWHERE, "context parallelism (Transformer Engine attention)",
                                            _TE_LAYERS),
    "megatron.torch_fsdp2": Capability(ANY, "megatron-core's TorchFullyShardedDataParallel (use_torch_fsdp2)"),
    # megatron-core 0.16's Megatron-FSDP gathers and reduce-scatters on CUDA streams, its buffers on a CUDA device
    "megatron.megatron_fsdp": Capability(GPU, "Megatron FSDP (use_megatron_fsdp, megatron-core's megatron_fsdp)"),
    "megatron.ckpt_format.torch": Capability(ANY, "Megatron-LM's legacy checkpoint layout (ckpt_format: torch)"),
    "megatron.ckpt_format.torch_dcp": Capability(NOWHERE, "torch DCP checkpoints (ckpt_format: torch_dcp)"),
    "megatron.ckpt_format.fsdp_dtensor": Capability(ANY, "Megatron-FSDP's DCP checkpoints (ckpt_format: fsdp_dtensor)"),
    "megatron.precision_aware_optimizer": Capability(
        GPU_TE, "megatron-core's precision-aware optimizer (on Transformer Engine's FusedAdam)"),
    # -- TorchTitan (primus/backends/torchtitan/admission.py)
    "torchtitan.float8": Capability(NOWHERE, "float8 training through TorchTitan's Float8 converter (torchao)"),
    "torchtitan.mx": Capability(NOWHERE, "MX (mxfp8 / mxfp4) training through TorchTitan's MX converter (torchao)"),
}


def refusal(feature: str, target: "Target") -> str | None:
    """Why ``target`` cannot run ``feature`` (one clause), or None when it can."""
    row = CAPABILITIES[feature]
    if row.needs == ANY:
        return None
    if row.needs == NOWHERE:
        return f"{row.what}: {row.why_not}"
    if not target.gpu:
        return f"{row.what} needs a GPU{' with Transformer Engine' if row.needs == GPU_TE else ''}; " \
               f"target {target.name} is a CPU"
    if row.needs == GPU_TE and not target.has_transformer_engine:
        return f"{row.what} needs Transformer Engine, which is not installed on this {target.name} host " \
               "(install it, or run in a ROCm / CUDA training image, which carries it)"
    return None
