"""What a TorchTitan train step reports, made complete for Primus' one step record.

- With pipeline parallelism only the last stage computes the loss; TorchTitan logs -1 on the
  other stages. ``global_loss`` gives every rank the real value (Primus reports it on rank 0,
  and stops every rank on a non-finite loss).
- TorchTitan stops on a non-finite loss itself, before logging the step; ``engine_non_finite_loss``
  lets the step be recorded and the run end as on every backend (``NonFiniteLoss``).
- TorchTitan 0.3.0's MoE has no auxiliary loss: it balances experts with a per-expert routing
  bias (auxiliary-loss-free, DeepSeek-V3). What it achieves is worth watching, so
  ``ExpertLoad`` reports the routed-token imbalance of each step.
"""
from __future__ import annotations

import re
from typing import Any

# trainer.py (0.3.0) raises this after the optimizer step and before logging or checkpointing it.
_ENGINE_NON_FINITE = re.compile(r"Loss is not finite \(global_avg_loss=([^)]+)\) at step (\d+)")


def engine_non_finite_loss(error: BaseException) -> float | None:
    """The loss in TorchTitan's own "Loss is not finite" stop, or None for any other error."""
    match = _ENGINE_NON_FINITE.search(str(error)) if isinstance(error, RuntimeError) else None
    return float(match.group(1)) if match else None


def global_loss(trainer: Any, loss: float) -> float:
    """The step's loss on every rank, also under pipeline parallelism."""
    dims = trainer.parallel_dims
    if not dims.pp_enabled:
        return loss
    import torch
    import torch.distributed as dist

    # Exactly one stage of each pipeline holds the loss (the last; which rank that is depends on
    # the schedule): a sum over the pipeline group hands it to all, NaN included.
    value = torch.tensor([loss if trainer.pp_has_last_stage else 0.0], dtype=torch.float64)
    dist.all_reduce(value, group=dims.get_mesh("pp").get_group())
    return float(value.item())


class ExpertLoad:
    """Routed tokens per expert of this rank's batch, read after each forward pass.

    ``extra()`` gives ``moe_load_imbalance``: the busiest expert's share over the mean share,
    averaged over MoE layers (1.0 = perfectly balanced). TorchTitan's optimizer hook zeroes the
    counters before Primus logs a step, so they are read as the forward passes end.
    """

    def __init__(self, model_parts: list[Any]):
        from torchtitan.models.common.moe import MoE

        self.layers = [module for part in model_parts for module in part.modules() if isinstance(module, MoE)]
        self.counts: dict[int, Any] = {}
        for part in model_parts if self.layers else []:
            part.register_forward_hook(self._snapshot)

    def _snapshot(self, *_: Any) -> None:
        for index, layer in enumerate(self.layers):
            counts = layer.tokens_per_expert_E
            counts = counts.to_local() if hasattr(counts, "to_local") else counts
            self.counts[index] = counts.detach().float().clone()

    def extra(self) -> dict[str, float]:
        ratios = [float(c.max() / c.mean()) for c in self.counts.values() if float(c.sum()) > 0]
        self.counts = {}
        for layer in self.layers:  # already zero when TorchTitan balances; else they would accumulate
            layer.tokens_per_expert_E.zero_()
        return {"moe_load_imbalance": sum(ratios) / len(ratios)} if ratios else {}
