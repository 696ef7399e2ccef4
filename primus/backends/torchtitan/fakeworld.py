"""TorchTitan's real model for one rank of a world far larger than this host, as TorchTitan's own dry
run does it (``comm.mode: fake_backend``): torch's fake process group (collectives that move nothing),
TorchTitan's device meshes for the whole world, and the rank's model built on the meta device and
parallelised by TorchTitan's own functions (tensor, pipeline, expert parallelism, FSDP2), never
materialised. What TorchTitan would refuse at that scale is refused here, in one line. The rank's
bytes come from its FSDP2 parameters: each shard's padded storage (weights, gradients) and the rows
it owns (Adam's moments).
"""
from __future__ import annotations

from typing import Any

from primus.config.errors import ConfigError
from primus.plan.layout import DTYPE_BYTES, ParallelLayout
from primus.plan.memory import ADAM_STATES, RankState

ENGINE_ERRORS = (AssertionError, ValueError, RuntimeError, TypeError, ZeroDivisionError, KeyError)


def _model_parts(cfg: Any, world: int) -> list:
    import torch
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.tools import utils

    dims = ParallelDims.from_config(cfg.parallelism, world)  # the steps of Trainer.__init__, up to the model
    dist_utils.set_spmd_backend(cfg.parallelism.spmd_backend)
    spec = cfg.model_spec
    model_config = spec.model
    model_config.update_from_config(config=cfg)
    with torch.device("meta"), utils.set_default_dtype(TORCH_DTYPE_MAP[cfg.training.dtype]):
        model = model_config.build()
    common = dict(parallel_dims=dims, training=cfg.training, parallelism=cfg.parallelism,
                  compile_config=cfg.compile, ac_config=cfg.activation_checkpoint, dump_folder=cfg.dump_folder)
    if dims.pp_enabled:
        _, parts, _, _ = spec.pipelining_fn(model, **common, device=torch.device("cpu"), model_config=model_config,
                                            parallelize_fn=spec.parallelize_fn,
                                            loss_fn=cfg.loss.build(compile_config=cfg.compile))
        return parts
    return [spec.parallelize_fn(model, **common)]


def _fsdp_params(parts: list) -> list:
    from torch.distributed.fsdp import FSDPModule

    found, seen = [], set()
    for part in parts:
        for module in part.modules():
            if not isinstance(module, FSDPModule):
                continue
            group = module._get_fsdp_state()._fsdp_param_group
            for param in group.fsdp_params if group is not None else []:
                if id(param) not in seen:
                    seen.add(id(param))
                    found.append(param)
    return found


def rank_state(cfg: Any, layout: ParallelLayout, rank: int, world: int) -> RankState:
    """Weights, gradients and Adam state of ``rank`` from TorchTitan's FSDP2 parameters on the meta device."""
    from primus.backends.torchtitan.patches import PATCHES, run_uses
    from primus.runtime.patches import Patcher, Where

    with Patcher(PATCHES, Where.here(run_uses(cfg.model_spec))):  # the run's, undone: a plan leaves none
        return _rank_state(cfg, layout, rank, world)


def _rank_state(cfg: Any, layout: ParallelLayout, rank: int, world: int) -> RankState:
    import math

    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise ConfigError("a fake-world build needs a process without a process group")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        parts = _model_parts(cfg, world)
        params = _fsdp_params(parts)
    except ENGINE_ERRORS as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"TorchTitan refuses this layout on {world} ranks (rank {rank}): {message}") from None
    finally:
        dist.destroy_process_group()
    padded = sum(math.prod(p.padded_sharded_param_size) for p in params)
    owned = sum(math.prod(p.sharded_size) for p in params)
    weight, grad = DTYPE_BYTES[layout.param_dtype], DTYPE_BYTES[layout.grad_dtype]
    # measured on real ranks (primus.plan.memory.fsdp2_state): under pipeline parallelism the last stage's
    # output head has its gradient reduced twice, once alone by the chunked loss
    heads = {id(part.lm_head.weight) for part in parts if layout.pp > 1 and getattr(part, "lm_head", None) is not None}
    head = [p for p in params if id(p.sharded_param) in heads]
    extra = sum(math.prod(p.padded_sharded_param_size) for p in head) * grad
    return RankState(padded * weight, padded * grad + extra, owned * ADAM_STATES * DTYPE_BYTES[layout.optimizer_dtype])
