"""The auxiliary losses megatron-core tracks beside the LM loss, per step, reduced across ranks
as Megatron-LM's training loop logs them: the MoE router's load-balancing / z-losses and the
multi-token-prediction losses. They reach ``StepReport.extra`` (metrics.jsonl, TensorBoard)."""
from __future__ import annotations


def aux_loss_metrics(config, num_microbatches: int) -> dict[str, float]:
    """{'load_balancing_loss': ..., 'mtp_1 loss': ...} for the step just run (empty if none).

    megatron-core's ``track_moe_metrics`` / ``MTPLossLoggingHelper.track_mtp_metrics`` (what
    Megatron-LM's ``training_log`` calls) reduce their trackers over the pipeline / data-parallel
    ranks, average the MoE losses over MoE layers and clear the trackers for the next step.
    ``loss_scale`` = 1 / micro-batches, as Megatron-LM passes.
    """
    totals: dict = {}
    if config.num_moe_experts:
        from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker, track_moe_metrics

        if get_moe_layer_wise_logging_tracker():
            track_moe_metrics(loss_scale=1.0 / num_microbatches, iteration=0, total_loss_dict=totals,
                              num_layers=config.num_layers, moe_layer_freq=config.moe_layer_freq,
                              mtp_num_layers=config.mtp_num_layers)
    if config.mtp_num_layers:
        from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

        MTPLossLoggingHelper.track_mtp_metrics(1.0 / num_microbatches, 0, None, total_loss_dict=totals)
    return {name: float(value) for name, value in totals.items()}
