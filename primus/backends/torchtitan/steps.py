"""What a TorchTitan train step reports, made complete for Primus' one step record.

- With pipeline parallelism only the last stage computes the loss; TorchTitan logs -1 on the
  other stages. ``global_loss`` gives every rank the real value (Primus reports it on rank 0,
  and stops every rank on a non-finite loss).
- TorchTitan stops on a non-finite loss itself, after the optimizer step and before logging the
  step. ``StepLoss`` sums the step's micro-batch losses as TorchTitan does, before the optimizer
  step, so a non-finite loss is recorded and ends the run as on every backend (``NonFiniteLoss``),
  from the values, before the update.
- TorchTitan 0.3.0's MoE has no auxiliary loss: it balances experts with a per-expert routing
  bias (auxiliary-loss-free, DeepSeek-V3). What it achieves is worth watching, so
  ``ExpertLoad`` reports the routed-token imbalance of each step.
"""
from __future__ import annotations

from typing import Any


class StepLoss:
    """The step's global loss from its micro-batch losses, known to every rank as the last
    gradient-accumulation group's backward ends (before the optimizer step).

    Each ``forward_backward_step`` returns this rank's loss sum over the global valid tokens;
    their sum over the loss mesh (data x context parallel) is the step's mean loss, as TorchTitan
    computes it for its log (``Trainer.train_step``)."""

    def __init__(self, trainer: Any):
        self.trainer, self.parts = trainer, []

    def add(self, loss: Any) -> float | None:
        """Take one group's loss; after the step's last group, the global loss (a collective)."""
        self.parts.append(loss.detach())
        if len(self.parts) < self.trainer.gradient_accumulation_steps:
            return None
        total, self.parts = self.parts[0].clone(), self.parts[1:]
        for part in self.parts:
            total.add_(part)
        self.parts = []
        dims = self.trainer.parallel_dims
        if dims.dp_cp_enabled:
            from torchtitan.distributed import utils as dist_utils

            value = dist_utils.dist_sum(total, dims.get_optional_mesh("loss"))
        else:
            value = float(total.item())
        return global_loss(self.trainer, value)


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


def batch_rank(trainer: Any) -> int:
    """This rank's place among the ranks that load different batches (TorchTitan's ``batch`` mesh, as
    its trainer hands ``dp_rank`` to the dataloader)."""
    dims = trainer.parallel_dims
    return dims.get_mesh("batch").get_local_rank() if dims.dp_enabled else 0


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
