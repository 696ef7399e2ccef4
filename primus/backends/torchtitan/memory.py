"""What one TorchTitan rank really allocates, counted from TorchTitan's own trainer after a step:
the measurement ``primus plan``'s memory model is held to (tests/plan, benchmarks/plan_memory.py).

- weights: the model parts' parameters (under FSDP2 each a DTensor whose local shard is counted; FSDP2
  keeps one padded flat storage per parameter group, so the padding is counted too);
- grads: the parameters' ``.grad`` after the backward pass (FSDP2: the reduce-scattered shards);
- optimizer: every tensor in the torch optimizers' state (Adam's moments), the scalar step counters
  left out;
- activations: ``primus.plan.measure.SavedForBackward`` over the step's forward and backward passes.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from primus.plan.measure import SavedForBackward, storage_bytes, storage_pointers


def static_bytes(trainer, grads: list) -> dict[str, int]:
    import torch

    params = [p for part in trainer.model_parts for p in part.parameters()]
    state = [value for optimizer in trainer.optimizers for entry in optimizer.state.values()
             for key, value in entry.items() if isinstance(value, torch.Tensor) and key != "step"]
    taken = storage_pointers(params) | storage_pointers(grads)
    return {"weights": storage_bytes(params), "grads": storage_bytes(grads),
            "optimizer": storage_bytes(state, exclude=taken)}


def measure_rank(plan, ctx) -> dict[str, Any]:
    """Build TorchTitan's trainer from ``plan`` as ``TorchTitanAdapter.run`` does, run one step with its
    forward and backward passes watched, count. Returns {weights, grads, optimizer, activations, loss, ...}."""
    from primus.backends.torchtitan.patches import PATCHES, run_uses
    from primus.runtime.patches import Patcher, Where

    with Patcher(PATCHES, Where.here(run_uses(plan.engine_config.model_spec))):  # as the run's
        return _measure(plan, ctx)


def _measure(plan, ctx) -> dict[str, Any]:
    from primus.backends.torchtitan.hooks import with_primus_components

    trainer = with_primus_components(plan.engine_config).build()
    trainer.attach(ctx, plan.flops_per_token)
    try:
        params = [p for part in trainer.model_parts for p in part.parameters()]
        saved = SavedForBackward(storage_pointers(params))
        forward_backward = trainer.forward_backward_step
        grads: list = []

        def watched(**kwargs):
            with saved, _gathered_parameters_paused(saved):
                loss = forward_backward(**kwargs)
            grads[:] = [p.grad for p in params]
            return loss

        trainer.forward_backward_step = watched  # this trainer object only, for this one step
        trainer.train_step(trainer.batch_generator(trainer.dataloader))
        dims = trainer.parallel_dims
        coordinates = {name: _mesh_rank(dims, name) for name in ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep")}
        return {**static_bytes(trainer, grads), "activations": saved.peak, **coordinates}
    finally:
        trainer.close()


@contextmanager
def _gathered_parameters_paused(saved: SavedForBackward) -> Iterator[None]:
    """FSDP2 all-gathers each parameter group into storages it keeps and resizes (never a new
    allocation after the first): parameters, not activations."""
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

    original = FSDPParam.init_all_gather_outputs

    def init_all_gather_outputs(self, *args, **kwargs):
        with saved.paused():
            return original(self, *args, **kwargs)

    FSDPParam.init_all_gather_outputs = init_all_gather_outputs
    try:
        yield
    finally:
        FSDPParam.init_all_gather_outputs = original


def _mesh_rank(dims, name: str) -> int:
    try:
        mesh = dims.get_optional_mesh(name)
    except (KeyError, ValueError, AttributeError):
        return 0
    return mesh.get_local_rank() if mesh is not None else 0
