"""The memory model's arithmetic on small cases worked by hand: megatron-core's buffer padding and the
distributed optimizer's shards, FSDP2's padded shards, pipeline placement, the heaviest rank. (That it
equals what the engines allocate is tests/plan/test_memory_measured.py.)"""
from __future__ import annotations

import pytest

from primus.plan.estimate import estimate_memory, fits_nowhere, rank_memory
from primus.plan.layout import ParallelLayout
from primus.plan.activations import forwards_in_flight
from primus.plan.memory import fsdp2_state, megatron_buffer, megatron_state, owned_per_rank
from primus.plan.model import ModelSpec
from primus.plan.tensors import Tensor

TINY = ModelSpec(n_layers=4, dim=128, n_heads=4, n_kv_heads=2, multiple_of=32, vocab_size=512)


def test_megatron_buffer_pads_parameters_to_64_and_buckets_to_lcm_of_shards_and_128():
    tensors = [Tensor("a", (100,)), Tensor("b", (30,))]  # built a, b; laid out b, a (reverse)
    plain = megatron_buffer(tensors, shards=3, distributed=False, bucket_size=None)
    assert plain.ranges == [(0, 30), (30, 130)] and plain.numel == 130  # no padding without the optimizer
    padded = megatron_buffer(tensors, shards=3, distributed=True, bucket_size=None)
    assert padded.ranges == [(0, 30), (64, 164)]  # a starts at the next multiple of 64
    assert padded.numel == 384  # 164 up to a multiple of lcm(3, 128) = 384
    # each rank owns 128 elements of the bucket; parameters, not padding, are what it keeps state for
    assert owned_per_rank(padded, 3) == [30 + 64, 36, 0]


def test_buckets_close_at_the_bucket_size_and_a_tied_embedding_has_its_own():
    tensors = [Tensor("embedding", (256,), shared_embedding=True), Tensor("w", (128,)), Tensor("v", (128,))]
    buffer = megatron_buffer(tensors, shards=2, distributed=True, bucket_size=200)
    assert buffer.buckets == [(0, 256), (256, 512)]  # v + w reach 200: closed; the embedding alone


def test_distributed_optimizer_state_is_the_owned_share_of_twelve_bytes():
    layout = ParallelLayout(dp=2, sharding="optimizer", param_dtype="bf16", memory_model="megatron")
    state = megatron_state([[Tensor("w", (256,))]], layout, shard_rank=0)
    assert (state.weights, state.grads, state.optimizer) == (256 * 2, 256 * 4, 128 * 12)
    unsharded = megatron_state([[Tensor("w", (256,))]], ParallelLayout(param_dtype="bf16", memory_model="megatron"))
    assert unsharded.optimizer == 256 * 12 and unsharded.weights == 256 * 2


def test_fsdp2_pads_each_shard_and_rank_zero_owns_the_most():
    layout = ParallelLayout(dp=4, dp_shard=4, sharding="fsdp", param_dtype="fp32", master_weights=False,
                            memory_model="torchtitan")
    tensors = [[Tensor("w", (10, 8))]]  # 10 rows over 4: 3 rows each, the last rank 1
    first, last = fsdp2_state(tensors, layout, 0), fsdp2_state(tensors, layout, 3)
    assert first.weights == last.weights == 3 * 8 * 4 and first.grads == 3 * 8 * 4
    assert (first.optimizer, last.optimizer) == (3 * 8 * 8, 1 * 8 * 8)


def test_interleaved_pipeline_places_virtual_stages_round_robin_and_keeps_more_in_flight():
    placement = ParallelLayout(pp=2, vpp=2).chunk_placement(4)
    assert [[c.layers for c in rank] for rank in placement] == [[(0,), (2,)], [(1,), (3,)]]
    assert placement[0][0].embedding and placement[1][1].loss
    assert forwards_in_flight(ParallelLayout(pp=4), 0, 8) == [0] * 4  # 1F1B: pp - rank
    assert forwards_in_flight(ParallelLayout(pp=4), 3, 8) == [0]
    assert forwards_in_flight(ParallelLayout(pp=2, vpp=2), 0, 4) == [0, 0, 1, 1, 0]  # 2 + 2 + 1 chunk forwards


def test_heaviest_rank_is_reported_with_its_stage():
    layout = ParallelLayout(pp=2, dp=2, sharding="optimizer", memory_model="megatron", global_batch_size=8)
    heaviest = estimate_memory(TINY, layout)
    stages = [rank_memory(TINY, layout, stage, None, None) for stage in range(2)]
    assert heaviest.total == max(stage.total for stage in stages)
    assert heaviest.rank == heaviest.pp_rank * 2  # the first rank of its stage (world 4, 2 ranks a stage)


def test_a_rank_no_device_can_hold_is_named():
    big = ModelSpec(n_layers=80, dim=8192, n_heads=64, n_kv_heads=8, ffn_hidden_size=28672, vocab_size=128256)
    reason = fits_nowhere(estimate_memory(big, ParallelLayout(memory_model="megatron")), 0.9)
    assert reason is not None and reason.startswith("rank 0 (pipeline stage 0) holds") and "mi355x" in reason
    assert fits_nowhere(estimate_memory(TINY, ParallelLayout(memory_model="megatron")), 0.9) is None


@pytest.mark.parametrize("n_layers, pp", [(4, 2), (32, 4), (7, 3), (80, 8)])
def test_torchtitan_stage_split_is_torchtitans(n_layers, pp):
    """The layout string Primus derives equals TorchTitan's own split of the modules over stages."""
    pipeline = pytest.importorskip("torchtitan.distributed.pipeline_parallel")
    from primus.backends.torchtitan.plan import _stage_layout
    from primus.plan.layout import parse_pipeline_layout

    ours = parse_pipeline_layout(_stage_layout({}, pp, n_layers))
    theirs = pipeline._generate_llm_fqn_per_model_part(pp, n_layers, 1, 1)
    assert [stage.count("t") for stage in ours] == [sum(m.startswith("layers.") for m in s) for s in theirs]
