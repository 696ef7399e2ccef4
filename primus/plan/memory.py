"""Weights, gradients and optimizer state of one rank as the engine lays them out (megatron-core's
DDP buffers and distributed optimizer, FSDP2's shards); activations are ``primus.plan.activations``.
The formulas are written out in ``primus.plan.estimate``'s docstring; tests/plan/test_memory_measured.py
holds them to the bytes counted on real engine ranks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from primus.plan.layout import DTYPE_BYTES, ParallelLayout
from primus.plan.model import ModelSpec
from primus.plan.tensors import Tensor, chunk_tensors

ADAM_STATES = 2  # Adam's two moments, in optimizer_dtype


@dataclass(frozen=True)
class RankState:
    weights: int
    grads: int
    optimizer: int


# ---- Megatron: DistributedDataParallel's contiguous buffers, the (distributed) optimizer ---------------

@dataclass
class _Buffer:
    """One megatron-core ``_ParamAndGradBuffer``: [(start, end)] of each parameter, bucket ends, size."""

    ranges: list[tuple[int, int]]
    buckets: list[tuple[int, int]]

    @property
    def numel(self) -> int:
        return self.buckets[-1][1] if self.buckets else 0


def megatron_buffer(tensors: list[Tensor], shards: int, distributed: bool, bucket_size: int | None) -> _Buffer:
    """megatron-core 0.16's ``_ParamAndGradBuffer`` layout: parameters in reverse order; with the distributed
    optimizer each starts at a multiple of 64 elements, each bucket ends at a multiple of lcm(shards, 128),
    and a tied embedding copy gets a bucket of its own; a new bucket once ``bucket_size`` is reached."""
    pad_to = math.lcm(shards, 128)
    ranges, buckets = [], []
    start = bucket_start = 0
    open_bucket = False

    def close(end: int) -> int:
        nonlocal bucket_start, open_bucket
        end = -(-end // pad_to) * pad_to if distributed else end
        buckets.append((bucket_start, end))
        bucket_start, open_bucket = end, False
        return end

    for tensor in reversed(tensors):
        if distributed:
            start = -(-start // 64) * 64
        own_bucket = tensor.shared_embedding and distributed
        if own_bucket and open_bucket:
            start = close(start)
        end = start + tensor.numel
        ranges.append((start, end))
        open_bucket = True
        if (bucket_size is not None and end - bucket_start >= bucket_size) or own_bucket:
            start = close(end)
        else:
            start = end
    if open_bucket:
        close(end)
    return _Buffer(ranges, buckets)


def owned_per_rank(buffer: _Buffer, shards: int) -> list[int]:
    """Elements of parameters (not padding) in each rank's shard of the buckets (DistributedOptimizer:
    bucket i's elements [lo + r * size, lo + (r + 1) * size) belong to rank r, size = bucket / shards)."""
    import bisect

    ranges = sorted(buffer.ranges)
    starts = [start for start, _ in ranges]
    covered = [0]  # prefix sums of parameter elements, to answer "elements in [a, b)" by bisection
    for start, end in ranges:
        covered.append(covered[-1] + end - start)

    def elements_below(x: int) -> int:
        i = bisect.bisect_right(starts, x)
        if i == 0:
            return 0
        start, end = ranges[i - 1]
        return covered[i - 1] + max(0, min(end, x) - start)

    owned = [0] * shards
    for lo, hi in buffer.buckets:
        size = (hi - lo) // shards
        for rank in range(shards):
            owned[rank] += elements_below(lo + (rank + 1) * size) - elements_below(lo + rank * size)
    return owned


def megatron_state(chunks: list[list[Tensor]], layout: ParallelLayout, shard_rank: int | None = 0,
                   expert_rank: int | None = 0, first_pp_rank: bool = True) -> RankState:
    """One DistributedDataParallel per model chunk, a buffer each for dense and for expert parameters.
    A rank of None: the shard rank that owns the most (the heaviest)."""
    distributed = layout.sharding == "optimizer"
    weight, grad = DTYPE_BYTES[layout.param_dtype], DTYPE_BYTES[layout.grad_dtype]
    master = 4 if layout.master_weights and weight < 4 else 0
    per_param_state = master + ADAM_STATES * DTYPE_BYTES[layout.optimizer_dtype]
    weights = grads = 0
    owned = {False: [0] * layout.shard_group, True: [0] * layout.expert_dp}
    for index, tensors in enumerate(chunks):
        bucket_size = layout.grad_bucket_size if index == 0 and first_pp_rank else None
        for expert, shards in ((False, layout.shard_group), (True, layout.expert_dp)):
            group = [t for t in tensors if t.expert == expert]
            if not group:
                continue
            buffer = megatron_buffer(group, shards, distributed, bucket_size)
            numel = sum(t.numel for t in group)
            weights += (buffer.numel if distributed else numel) * weight
            grads += buffer.numel * grad
            per_rank = owned_per_rank(buffer, shards) if distributed else [numel] * shards
            owned[expert] = [a + b for a, b in zip(owned[expert], per_rank)]
    pick = {False: shard_rank, True: expert_rank}
    elements = sum(max(owned[k]) if pick[k] is None else owned[k][pick[k]] for k in (False, True))
    return RankState(weights, grads, elements * per_param_state)


# ---- FSDP2 (TorchTitan): every parameter sharded on its first dimension -----------------------------

def fsdp2_state(chunks: list[list[Tensor]], layout: ParallelLayout, shard_rank: int = 0) -> RankState:
    """FSDP2 keeps each parameter's shard in a storage padded to ceil(rows / shards) rows (weights, and
    the reduce-scattered gradients alike); Adam's moments are allocated for the rows this rank owns."""
    weight, grad = DTYPE_BYTES[layout.param_dtype], DTYPE_BYTES[layout.grad_dtype]
    state = ADAM_STATES * DTYPE_BYTES[layout.optimizer_dtype] + (
        4 if layout.master_weights and weight < 4 else 0)
    weights = grads = optimizer = 0
    for tensors in chunks:
        for tensor in tensors:
            shards = layout.expert_fsdp if tensor.expert else layout.shard_group
            # TorchTitan shards routed experts on their second dimension when there are fewer than shards
            dim = 1 if tensor.expert and shards > tensor.shape[0] else 0
            length = tensor.shape[dim]
            rows = -(-length // shards)
            rest = tensor.numel // length
            owned = max(0, min(rows, length - shard_rank * rows))
            weights += rows * rest * weight
            grads += rows * rest * grad
            optimizer += owned * rest * state
            if layout.pp > 1 and tensor.name == "output_layer.weight":
                # the chunked loss reduce-scatters the head's gradient alone (its sync switched on for the
                # last chunk) before the final norm's exists; the pipeline's end-of-step reduction of
                # [norm, head] then allocates the group's buffer again, kept by the norm's gradient
                grads += rows * rest * grad
    return RankState(weights, grads, optimizer)


def generic_state(chunks: list[list[Tensor]], layout: ParallelLayout) -> RankState:
    """No engine's padding: N bytes per parameter, divided by the ranks that shard them."""
    dense = sum(t.numel for c in chunks for t in c if not t.expert)
    experts = sum(t.numel for c in chunks for t in c if t.expert)

    def sharded(per_param: int, on: bool) -> int:
        if not on:
            return (dense + experts) * per_param
        return -(-dense * per_param // layout.shard_group) + -(-experts * per_param // layout.expert_dp)

    weight, grad = DTYPE_BYTES[layout.param_dtype], DTYPE_BYTES[layout.grad_dtype]
    master = 4 if layout.master_weights and weight < 4 else 0
    fsdp = layout.sharding == "fsdp"
    return RankState(sharded(weight, fsdp), sharded(grad, fsdp),
                     sharded(master + ADAM_STATES * DTYPE_BYTES[layout.optimizer_dtype],
                             layout.sharding in ("optimizer", "fsdp")))


def rank_state(model: ModelSpec, layout: ParallelLayout, pp_rank: int = 0, shard_rank: int | None = 0,
               expert_rank: int | None = 0) -> RankState:
    """Weights, gradients and optimizer state of one rank (its pipeline rank and its index in the
    sharding groups; None = the heaviest index)."""
    chunks = [chunk_tensors(model, layout, pp_rank, c) for c in range(len(layout.chunk_placement(model.n_layers)[0]))]
    return state_of(chunks, layout, shard_rank, expert_rank, first_pp_rank=pp_rank == 0)


def state_of(chunks: list[list[Tensor]], layout: ParallelLayout, shard_rank: int | None = 0,
             expert_rank: int | None = 0, first_pp_rank: bool = True) -> RankState:
    """The engine's layout of these parameter tensors. Megatron with FSDP (torch FSDP2 or Megatron-FSDP):
    the textbook formulas, not yet measured."""
    if layout.memory_model in ("megatron", "megatron-te") and layout.sharding != "fsdp":
        return megatron_state(chunks, layout, shard_rank, expert_rank, first_pp_rank)
    if layout.memory_model == "torchtitan":
        return fsdp2_state(chunks, layout, shard_rank or 0)  # rank 0 owns the most rows
    return generic_state(chunks, layout)
