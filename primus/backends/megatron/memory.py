"""What one Megatron rank really allocates, counted from megatron-core's own objects after a step:
the measurement ``primus plan``'s memory model is held to (tests/plan, benchmarks/plan_memory.py).

- weights: the model chunks' parameters (with the distributed optimizer they live in DDP's
  contiguous parameter buffer, padding included);
- grads: DDP's contiguous gradient buffers (``main_grad``), padding included;
- optimizer: the state of each torch optimizer inside megatron-core's (Adam's moments) and the
  parameters it updates where they are not the model's (fp32 main copies of bf16 weights), Adam's
  scalar step counters left out;
- activations: ``primus.plan.measure.SavedForBackward`` over one ``train_step``.
"""
from __future__ import annotations

from typing import Any

from primus.plan.measure import SavedForBackward, storage_bytes, storage_pointers


def _torch_optimizers(optimizer) -> list:
    """The torch optimizers inside megatron-core's (chained, distributed, mixed precision, fp32)."""
    inner = getattr(optimizer, "chained_optimizers", None)
    if inner is not None:
        return [torch_opt for part in inner for torch_opt in _torch_optimizers(part)]
    return [optimizer.optimizer]


def _parameters(model: list) -> list:
    return [p for chunk in model for p in chunk.parameters()]


def _optimizer_tensors(optimizer) -> list:
    import torch

    tensors = []
    for torch_opt in _torch_optimizers(optimizer):
        for group in torch_opt.param_groups:
            tensors += group["params"]
        for state in torch_opt.state.values():
            tensors += [v for k, v in state.items() if isinstance(v, torch.Tensor) and k != "step"]
    return tensors


def static_bytes(model: list, optimizer) -> dict[str, int]:
    """{weights, grads, optimizer}: bytes of distinct storages on this rank, each counted once."""
    params = _parameters(model)
    weights = storage_bytes(params)
    grads_of = [getattr(p, "main_grad", None) if getattr(p, "main_grad", None) is not None else p.grad
                for p in params]
    grads = storage_bytes(grads_of)
    taken = storage_pointers(params) | storage_pointers(grads_of)
    return {"weights": weights, "grads": grads,
            "optimizer": storage_bytes(_optimizer_tensors(optimizer), exclude=taken)}


def measure_rank(trainer) -> dict[str, Any]:
    """One ``train_step`` of a set-up ``MegatronTrainer``, its forward and backward passes watched (not
    the optimizer step: Adam's state is created there), then the static bytes.
    Returns {weights, grads, optimizer, activations, loss}."""
    params = _parameters(trainer.model)
    known = storage_pointers(params) | storage_pointers(getattr(p, "main_grad", None) for p in params)
    saved = SavedForBackward(known)
    forward_backward = trainer._forward_backward

    def watched(*args, **kwargs):
        with saved:
            return forward_backward(*args, **kwargs)

    trainer._forward_backward = watched  # this trainer object only, for this one step
    try:
        loss, *_ = trainer.train_step()
    finally:
        del trainer._forward_backward
    return {**static_bytes(trainer.model, trainer.optimizer), "activations": saved.peak, "loss": loss}
