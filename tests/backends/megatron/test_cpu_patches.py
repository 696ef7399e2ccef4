"""Each CPU patch: the upstream megatron-core call fails without it and works with it.

Every check runs in this process: call upstream, expect the CPU failure, apply the one patch through
a ``Swaps`` (the record a run's ``Patcher`` keeps), call again, expect success; the ``swaps`` fixture
undoes the patch after the test, so the next check meets upstream as installed.
"""
from __future__ import annotations

import tempfile

import pytest

pytest.importorskip("megatron.core")
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only patches")


@pytest.fixture
def swaps():
    """What the test's patches replaced, put back after it."""
    from primus.runtime.patches import Swaps

    applied = Swaps()
    yield applied
    applied.restore()


@pytest.fixture
def one_rank():
    """A one-rank gloo group for the test (megatron-core's collectives and groups need one), gone after it."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def model_parallel(one_rank):
    """megatron-core's parallel state on the one rank (and its model-parallel RNG tracker), reset after."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as mrandom

    parallel_state.initialize_model_parallel()
    yield
    mrandom.get_cuda_rng_tracker().reset()
    parallel_state.destroy_model_parallel()


@pytest.fixture
def rng_tracker():
    """megatron-core's model-parallel RNG tracker, empty for the test and emptied after it."""
    from megatron.core.tensor_parallel import random as mrandom

    mrandom.get_cuda_rng_tracker().reset()
    yield mrandom.get_cuda_rng_tracker()
    mrandom.get_cuda_rng_tracker().reset()


def test_patch_current_device_makes_rope_work(swaps):
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    from primus.backends.megatron import cpu_patches

    rope = RotaryEmbedding(kv_channels=16, rotary_percent=1.0, use_cpu_initialization=True)
    with pytest.raises((AssertionError, RuntimeError)):
        rope(8)
    cpu_patches.patch_current_device(swaps)
    assert tuple(rope(8).shape) == (8, 1, 1, 16)


def test_patch_rng_tracker_gives_independent_cpu_stream(swaps):
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    from primus.backends.megatron import cpu_patches

    with pytest.raises((AssertionError, RuntimeError)):
        CudaRNGStatesTracker().add("tp", 7)
    cpu_patches.patch_rng_tracker(swaps)
    tracker = CudaRNGStatesTracker()
    tracker.add("tp", 7)
    torch.manual_seed(0)
    with tracker.fork("tp"):
        a = torch.rand(3)
    with tracker.fork("tp"):
        b = torch.rand(3)  # the stream advanced: a different draw
    outer = torch.rand(3)
    torch.manual_seed(0)
    same_outer = torch.rand(3)  # fork() left the default stream untouched
    assert torch.equal(a, torch.rand(3, generator=torch.Generator().manual_seed(7)))
    assert not torch.equal(a, b)
    assert torch.equal(outer, same_outer)


def test_patch_cuda_device_arguments_makes_grad_scaler_work(swaps):
    from megatron.core.optimizer.grad_scaler import ConstantGradScaler

    from primus.backends.megatron import cpu_patches

    with pytest.raises((AssertionError, RuntimeError)):
        ConstantGradScaler(2.0)
    cpu_patches.patch_cuda_device_arguments(swaps)
    scaler = ConstantGradScaler(2.0)
    assert scaler.scale.device.type == "cpu" and torch.ones(2).cuda().device.type == "cpu"


def test_patch_param_type_checks_makes_grad_clipping_work(swaps):
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

    from primus.backends.megatron import cpu_patches

    cpu_patches.patch_cuda_device_arguments(swaps)  # the 'cuda' scratch tensors: not what is tested
    param = torch.nn.Parameter(torch.ones(4))
    param.grad = torch.full((4,), 10.0)
    with pytest.raises(AssertionError):
        clip_grad_by_total_norm_fp32([param], max_norm=1.0, total_norm=20.0)
    cpu_patches.patch_param_type_checks(swaps)
    clip_grad_by_total_norm_fp32([param], max_norm=1.0, total_norm=20.0)
    assert round(param.grad[0].item(), 3) == 0.5
    assert torch.ones(1).type() == "torch.cuda.FloatTensor"
    assert torch.ones(1).type(torch.float64).dtype == torch.float64


def test_patch_recompute_rng_makes_activation_recompute_work(rng_tracker, swaps):
    from megatron.core.tensor_parallel import random as mrandom

    from primus.backends.megatron import cpu_patches

    cpu_patches.patch_rng_tracker(swaps)
    rng_tracker.add(mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME, 5)

    def block(x):
        return torch.nn.functional.dropout(x, p=0.5) * 3

    x = torch.ones(64, requires_grad=True)
    with pytest.raises((AssertionError, RuntimeError)):
        mrandom.checkpoint(block, False, x)
    cpu_patches.patch_recompute_rng(swaps)
    torch.manual_seed(0)
    y = mrandom.checkpoint(block, False, x)
    y.sum().backward()
    # the recomputed forward drew the same dropout mask: gradient is non-zero exactly where y is
    assert torch.equal(x.grad != 0, y.detach() != 0)
    assert int((y == 0).sum()) > 0


def test_patch_moe_router_gemm_name_makes_fp32_router_work(swaps):
    from megatron.core.transformer.moe import moe_utils

    from primus.backends.megatron import cpu_patches

    x, w = torch.randn(3, 8), torch.randn(4, 8)
    with pytest.raises(NameError):
        moe_utils.router_gating_linear(x, w, None, torch.float32)
    cpu_patches.patch_moe_router_gemm_name(swaps)
    assert torch.allclose(moe_utils.router_gating_linear(x, w, None, torch.float32), x @ w.t())


def test_patch_alltoall_dispatcher_without_cuda_streams(one_rank, swaps):
    """The dispatcher's device-to-host step leaves split sizes that all_to_all_single takes."""
    import torch.distributed as dist
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher as D

    from primus.backends.megatron import cpu_patches

    class State:  # the attributes the DtoH step reads, as preprocess() leaves them on CPU
        drop_and_pad, cuda_dtoh_point, cuda_dtoh_stream = False, "before_ep_alltoall", None
        input_splits, output_splits = torch.tensor([4]), torch.tensor([4])
        output_splits_tp, num_out_tokens, num_local_experts = torch.tensor([4]), torch.tensor(4), 1

    state = State()
    with pytest.raises((RuntimeError, AssertionError, AttributeError)):
        D._maybe_dtoh_and_synchronize(state, "before_ep_alltoall", torch.tensor([4]))
    x = torch.arange(4.0)
    with pytest.raises(TypeError):  # tensor split sizes
        dist.all_to_all_single(torch.empty(4), x, output_split_sizes=state.output_splits,
                               input_split_sizes=state.input_splits)
    cpu_patches.patch_alltoall_dispatcher_without_cuda_streams(swaps)
    assert not isinstance(D.cuda_dtoh_stream, type(None))  # __init__ will not build a CUDA stream
    D._maybe_dtoh_and_synchronize(state, "before_ep_alltoall", torch.tensor([4]))
    out = torch.empty(4)
    dist.all_to_all_single(out, x, output_split_sizes=state.output_splits, input_split_sizes=state.input_splits)
    assert type(state.input_splits).__name__ == "ndarray"
    assert torch.equal(out, x)
    assert state.output_splits_tp.tolist() == [4]


def test_patch_identity_reduce_for_single_rank_groups(model_parallel, swaps):
    """MoE experts with biases at expert TP = EP = 1 (gpt-oss style) add the bias in place to the
    output of a one-rank all-reduce; upstream's autograd Function makes that a forbidden view."""
    from megatron.core.tensor_parallel import layers

    from primus.backends.megatron import cpu_patches

    def step():
        x = torch.ones(3, requires_grad=True)
        y = layers.reduce_from_tensor_model_parallel_region(x * 2)
        y += 1.0
        y.sum().backward()
        return x.grad.tolist()

    with pytest.raises(RuntimeError, match="is a view"):
        step()
    cpu_patches.patch_identity_reduce_for_single_rank_groups(swaps)
    assert step() == [2.0, 2.0, 2.0]


def test_patch_mla_without_transformer_engine(swaps):
    from megatron.core.transformer import multi_latent_attention as mla

    from primus.backends.megatron import cpu_patches

    with pytest.raises(TypeError):
        mla.HAVE_TE and isinstance(torch.nn.Linear(1, 1), mla.TELinear)  # MLASelfAttention.__init__'s test
    cpu_patches.patch_mla_without_transformer_engine(swaps)
    assert (mla.HAVE_TE and isinstance(torch.nn.Linear(1, 1), mla.TELinear)) is False
    assert mla.TELinear is None


def test_patch_local_attention_mla_head_dims(model_parallel, swaps):
    """MLA's core attention with Q/K heads of 24 and V heads of 16 on the local spec."""
    from megatron.core import tensor_parallel
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from primus.backends.megatron import cpu_patches

    cpu_patches.patch_current_device(swaps)
    cpu_patches.patch_rng_tracker(swaps)
    tensor_parallel.model_parallel_cuda_manual_seed(1)  # attention dropout forks the TP stream
    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, attention_dropout=0.0,
                               masked_softmax_fusion=False)

    def build():
        return DotProductAttention(config, 1, AttnMaskType.causal, "self", k_channels=24, v_channels=16)

    with pytest.raises(TypeError):
        build()
    cpu_patches.patch_local_attention_mla_head_dims(swaps)
    attention = build()
    q, k, v = torch.randn(5, 2, 4, 24), torch.randn(5, 2, 4, 24), torch.randn(5, 2, 4, 16)
    mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1).view(1, 1, 5, 5)
    context = attention(q, k, v, mask)
    reference = torch.nn.functional.scaled_dot_product_attention(
        q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3), is_causal=True)  # scale 1/sqrt(24)
    assert tuple(context.shape) == (5, 2, 64)
    assert torch.allclose(context, reference.permute(2, 0, 1, 3).reshape(5, 2, 64), atol=1e-5)


def test_patch_torch_norm_sequence_parallel(swaps):
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_config import TransformerConfig

    from primus.backends.megatron import cpu_patches

    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, tensor_model_parallel_size=2,
                               sequence_parallel=True, normalization="RMSNorm", persist_layer_norm=False)
    with pytest.raises(AssertionError):
        WrappedTorchNorm(config, 8)
    cpu_patches.patch_torch_norm_sequence_parallel(swaps)
    norm = WrappedTorchNorm(config, 8)
    plain = WrappedTorchNorm(TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2,
                                               normalization="RMSNorm", persist_layer_norm=False), 8)
    assert type(norm).__name__ == "RMSNorm"
    assert [getattr(p, "sequence_parallel", None) for p in norm.parameters()] == [True]
    assert [getattr(p, "sequence_parallel", None) for p in plain.parameters()] == [None]


def test_patch_torch_fsdp2_cpu_mesh(model_parallel, swaps):
    """megatron-core's FSDP2 wrapper shards a megatron-core layer on a CPU mesh (upstream asks for "cuda")."""
    from megatron.core.distributed import DistributedDataParallelConfig, TorchFullyShardedDataParallel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from primus.backends.megatron import cpu_patches

    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, use_cpu_initialization=True)

    def wrap():
        return TorchFullyShardedDataParallel(config, DistributedDataParallelConfig(), torch.nn.Linear(8, 8))

    with pytest.raises((RuntimeError, AssertionError)):
        wrap()
    cpu_patches.patch_torch_fsdp2_cpu_mesh(swaps)
    model = wrap()
    assert model.device_mesh.device_type == "cpu"
    assert type(model.module.weight).__name__ == "DTensor"


def test_patch_fsdp2_finish_grad_sync_signature(swaps):
    """finalize_model_grads calls finish_grad_sync(force_all_reduce=...) on every chunk, FSDP2's included."""
    from megatron.core.distributed import TorchFullyShardedDataParallel

    from primus.backends.megatron import fsdp_patches

    chunk = TorchFullyShardedDataParallel.__new__(TorchFullyShardedDataParallel)
    with pytest.raises(TypeError):
        chunk.finish_grad_sync(force_all_reduce=False)
    fsdp_patches.patch_fsdp2_finish_grad_sync_signature(swaps)
    chunk.finish_grad_sync(force_all_reduce=False)  # no TypeError


def test_patch_fsdp2_optimizer_param_identity(one_rank, swaps):
    """The optimizer's checkpoint finds an FSDP2 parameter by its local shard (torch >= 2.13's to_local
    returns a fresh view of a Parameter(DTensor))."""
    from megatron.core.dist_checkpointing.optimizer import get_optim_param_to_id_map
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from primus.backends.megatron import fsdp_patches

    param = torch.nn.Parameter(distribute_tensor(torch.ones(4, 2), init_device_mesh("cpu", (1,)), [Shard(0)]))

    def found():
        return id(param._local_tensor) in get_optim_param_to_id_map([param])

    assert not found()
    fsdp_patches.patch_fsdp2_optimizer_param_identity(swaps)
    assert found()

@pytest.mark.parametrize("tp, dp, slots", [
    (1, 2, [[0, 1]]),                  # DP rank 0 holds W, rank 1 holds V
    (1, 4, [[0, 1, 2, 3]]),            # two slices of W, then two of V
    (2, 2, [[0, 2], [1, 3]]),          # [W_tp0, W_tp1, V_tp0, V_tp1]: the layout without FSDP
])
def test_fsdp2_swiglu_slot_is_the_layout_without_fsdp(tp, dp, slots):
    """patch_fsdp2_swiglu_checkpoint_layout's arithmetic (its effect: test_fsdp.py's DDP-from-FSDP2 resume)."""
    from primus.backends.megatron.fsdp_patches import fsdp2_swiglu_slot

    rows = 704 * tp  # [W; V] of every TP rank
    local = rows // tp // dp
    assert [[fsdp2_swiglu_slot(rows, local, tp, t, dp, d) for d in range(dp)] for t in range(tp)] == slots
    with pytest.raises(ValueError, match="wholly inside W or V"):
        fsdp2_swiglu_slot(rows, rows // tp // 3, tp, 0, 3, 0)
