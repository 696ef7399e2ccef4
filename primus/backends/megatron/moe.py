"""MoE bits the trainer needs beside megatron-core's own MoE layers: the router's auxiliary
losses per step, reduced across ranks and averaged over MoE layers as Megatron-LM logs them."""
from __future__ import annotations


def moe_step_metrics(config, num_microbatches: int) -> dict[str, float]:
    """{'load_balancing_loss': ..., 'z_loss': ...} for the step just run (empty if none was tracked).

    megatron-core's ``track_moe_metrics`` (the function Megatron-LM's training loop calls) reduces
    the per-layer tracker over pipeline and data-parallel ranks, divides by the MoE layer count and
    clears it for the next step. ``loss_scale`` = 1 / micro-batches, as Megatron-LM passes.
    """
    from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker, track_moe_metrics

    if not get_moe_layer_wise_logging_tracker():
        return {}
    totals: dict = {}
    track_moe_metrics(loss_scale=1.0 / num_microbatches, iteration=0, total_loss_dict=totals,
                      num_layers=config.num_layers, moe_layer_freq=config.moe_layer_freq,
                      mtp_num_layers=config.mtp_num_layers)
    return {name: float(value) for name, value in totals.items()}
