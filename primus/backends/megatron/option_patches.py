"""megatron-core patches that a run option asks for (not compatibility fixes): applied only when the run sets it.

``patches.py`` lists each under the megatron-core version gate with a ``uses(...)`` condition, so
``primus patches EXP`` shows it for the runs that set the option and the run's ``Patcher`` undoes it.
"""
from __future__ import annotations

from primus.runtime.patches import PERMANENT, Swaps

_pending: list = []  # per bucket reduced: a device tensor counting the elements zeroed (read once per step)


def sanitize_nan_grads(swap: Swaps = PERMANENT) -> None:
    """NaN/Inf gradient elements become 0 in each DDP bucket before megatron-core checks and reduces it.

    Why: ``primus.sanitize_nan_grads`` (AMD Primus: ``sft_sanitize_nan_grads``) keeps benchmark runs alive
    whose backward occasionally yields NaN/Inf (bf16 grouped GEMMs under forced random MoE routing), where
    megatron-core's grad check raises. AMD patches ``_ParamAndGradBucketGroup.check_grads``; that runs only
    while ``check_for_nan_in_loss_and_grad`` is on, so here the replacement is made at the top of
    ``start_grad_sync`` (megatron-core 0.16.1): before the check, the gradient scaling and the DP
    all-reduce / reduce-scatter, with the check on or off. The call that only returns (the first batch's
    collective already in flight under ``overlap_grad_reduce``) touches nothing: that bucket was cleaned
    when its collective was issued. The count stays on the device (no sync per bucket); ``take_sanitized``
    reads it once per step. Only megatron-core's DDP has these buckets (FSDP is refused by admission).
    """
    import torch
    from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBucketGroup

    original = _ParamAndGradBucketGroup.start_grad_sync
    _pending.clear()  # a run in this process before (a test) may have stopped mid-step

    def start_grad_sync(self, *args, **kwargs):
        if not (self.is_first_batch and self.grad_reduce_handle is not None):  # upstream's own early return
            for bucket in self.buckets:
                bad = ~torch.isfinite(bucket.grad_data)
                _pending.append(bad.sum())
                bucket.grad_data.masked_fill_(bad, 0.0)
        return original(self, *args, **kwargs)

    swap.set(_ParamAndGradBucketGroup, "start_grad_sync", start_grad_sync)


def take_sanitized() -> int:
    """Gradient elements ``sanitize_nan_grads`` zeroed on this rank since the last call (0 when not applied)."""
    if not _pending:
        return 0
    import torch

    count = int(torch.stack(_pending).sum())  # one device sync for the step
    _pending.clear()
    return count
