"""megatron-core's real model for one rank of a world far larger than this host: a fake process group
(torch's ``fake`` backend: collectives that move nothing), megatron-core's parallel state for the whole
world, and the rank's GPTModel chunks built on the meta device (no memory, no initialisation). What
megatron-core would refuse at that scale (a layout its parallel state or its model does not accept)
is refused here, in one line. The rank's parameters, as megatron-core registers them, give its bytes
through the memory model the measured ranks verify (``primus.plan.memory.megatron_state``).
"""
from __future__ import annotations

from typing import Any

from primus.config.errors import ConfigError
from primus.plan.layout import ParallelLayout
from primus.plan.memory import RankState, state_of
from primus.plan.tensors import Tensor

ENGINE_ERRORS = (AssertionError, ValueError, RuntimeError, TypeError, ZeroDivisionError)


def rank_tensors(args: Any, rank: int, world: int) -> list[list[Tensor]]:
    """The parameters of ``rank``'s model chunks (megatron-core's local layer spec: the parameters of
    Transformer Engine's are the same, its norms fused into the linear layers)."""
    from primus.backends.megatron.patches import PATCHES
    from primus.runtime.patches import Patcher, Where

    with Patcher(PATCHES, Where.here(())):  # the run's patches, undone: a plan leaves none applied
        return _rank_tensors(args, rank, world)


def _rank_tensors(args: Any, rank: int, world: int) -> list[list[Tensor]]:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from primus.backends.megatron.model import Derived, build_model, padded_vocab_size, parallel_sizes, transformer_config

    if dist.is_initialized():
        raise ConfigError("a fake-world build needs a process without a process group")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        parallel_state.initialize_model_parallel(**parallel_sizes(args),
                                                 create_gloo_process_groups=False)  # fake backend: no gloo
        config = transformer_config(args, on_gpu=False, derived=Derived(), use_te=False)
        config.perform_initialization = False
        vocab = padded_vocab_size(args.vocab_size, args)
        with torch.device("meta"):
            chunks = build_model(args, config, vocab, use_te=False)
        return [[Tensor(name, tuple(p.shape), expert=not getattr(p, "allreduce", True),
                        shared_embedding=bool(getattr(p, "shared_embedding", False)))
                 for name, p in chunk.named_parameters() if p.requires_grad] for chunk in chunks]
    except ENGINE_ERRORS as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"megatron-core refuses this layout on {world} ranks (rank {rank}): {message}") from None
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def rank_state(args: Any, layout: ParallelLayout, rank: int, world: int) -> RankState:
    """Weights, gradients and optimizer state of ``rank`` from megatron-core's real parameters: its DDP
    buffers and (distributed) optimizer laid out over them (the heaviest shard of the stage)."""
    chunks = rank_tensors(args, rank, world)
    first_stage = rank // (world // layout.pp) == 0
    return state_of(chunks, layout, None, None, first_pp_rank=first_stage)
