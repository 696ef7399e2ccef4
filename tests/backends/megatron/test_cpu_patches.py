"""Each CPU patch: the upstream megatron-core call fails without it and works with it.

Every check runs in a fresh interpreter (patches are process-global): call upstream, expect the
CPU failure, apply the one patch, call again, expect success.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("megatron.core")
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only patches")


def run_check(body: str) -> str:
    code = "import warnings; warnings.simplefilter('ignore')\nimport torch\n" + textwrap.dedent(body)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.mark.e2e
def test_patch_current_device_makes_rope_work():
    out = run_check("""
        from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
        from primus.backends.megatron import cpu_patches
        rope = RotaryEmbedding(kv_channels=16, rotary_percent=1.0, use_cpu_initialization=True)
        try:
            rope(8)
            print("UNPATCHED-OK")
        except (AssertionError, RuntimeError) as exc:
            print("UNPATCHED-FAILS")
        cpu_patches.patch_current_device()
        print("PATCHED", tuple(rope(8).shape))
    """)
    assert "UNPATCHED-FAILS" in out and "PATCHED (8, 1, 1, 16)" in out


@pytest.mark.e2e
def test_patch_rng_tracker_gives_independent_cpu_stream():
    out = run_check("""
        from megatron.core.tensor_parallel.random import CudaRNGStatesTracker
        from primus.backends.megatron import cpu_patches
        try:
            CudaRNGStatesTracker().add("tp", 7)
            print("UNPATCHED-OK")
        except (AssertionError, RuntimeError) as exc:
            print("UNPATCHED-FAILS")
        cpu_patches.patch_rng_tracker()
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
        print("PATCHED", torch.equal(a, torch.rand(3, generator=torch.Generator().manual_seed(7))), not torch.equal(a, b),
              torch.equal(outer, same_outer))
    """)
    assert "UNPATCHED-FAILS" in out and "PATCHED True True True" in out


@pytest.mark.e2e
def test_patch_cuda_device_arguments_makes_grad_scaler_work():
    out = run_check("""
        from megatron.core.optimizer.grad_scaler import ConstantGradScaler
        from primus.backends.megatron import cpu_patches
        try:
            ConstantGradScaler(2.0)
            print("UNPATCHED-OK")
        except (AssertionError, RuntimeError) as exc:
            print("UNPATCHED-FAILS")
        cpu_patches.patch_cuda_device_arguments()
        scaler = ConstantGradScaler(2.0)
        print("PATCHED", scaler.scale.device.type, torch.ones(2).cuda().device.type)
    """)
    assert "UNPATCHED-FAILS" in out and "PATCHED cpu cpu" in out


@pytest.mark.e2e
def test_patch_param_type_checks_makes_grad_clipping_work():
    out = run_check("""
        from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32
        from primus.backends.megatron import cpu_patches
        cpu_patches.patch_cuda_device_arguments()  # the 'cuda' scratch tensors: not what is tested
        param = torch.nn.Parameter(torch.ones(4))
        param.grad = torch.full((4,), 10.0)
        try:
            clip_grad_by_total_norm_fp32([param], max_norm=1.0, total_norm=20.0)
            print("UNPATCHED-OK")
        except AssertionError:
            print("UNPATCHED-FAILS")
        cpu_patches.patch_param_type_checks()
        clip_grad_by_total_norm_fp32([param], max_norm=1.0, total_norm=20.0)
        print("PATCHED", round(param.grad[0].item(), 3), torch.ones(1).type(), torch.ones(1).type(torch.float64).dtype)
    """)
    assert "UNPATCHED-FAILS" in out
    assert "PATCHED 0.5 torch.cuda.FloatTensor torch.float64" in out


@pytest.mark.e2e
def test_patch_recompute_rng_makes_activation_recompute_work():
    out = run_check("""
        from megatron.core.tensor_parallel import random as mrandom
        from primus.backends.megatron import cpu_patches
        cpu_patches.patch_rng_tracker()
        mrandom.get_cuda_rng_tracker().add(mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME, 5)
        def block(x):
            return torch.nn.functional.dropout(x, p=0.5) * 3
        x = torch.ones(64, requires_grad=True)
        try:
            mrandom.checkpoint(block, False, x)
            print("UNPATCHED-OK")
        except (AssertionError, RuntimeError) as exc:
            print("UNPATCHED-FAILS")
        cpu_patches.patch_recompute_rng()
        torch.manual_seed(0)
        y = mrandom.checkpoint(block, False, x)
        y.sum().backward()
        # the recomputed forward drew the same dropout mask: gradient is non-zero exactly where y is
        print("PATCHED", torch.equal(x.grad != 0, y.detach() != 0), int((y == 0).sum()) > 0)
    """)
    assert "UNPATCHED-FAILS" in out and "PATCHED True True" in out


@pytest.mark.e2e
def test_patch_moe_router_gemm_name_makes_fp32_router_work():
    out = run_check("""
        from megatron.core.transformer.moe import moe_utils
        from primus.backends.megatron import cpu_patches
        x, w = torch.randn(3, 8), torch.randn(4, 8)
        try:
            moe_utils.router_gating_linear(x, w, None, torch.float32)
            print("UNPATCHED-OK")
        except NameError:
            print("UNPATCHED-FAILS")
        cpu_patches.patch_moe_router_gemm_name()
        out = moe_utils.router_gating_linear(x, w, None, torch.float32)
        print("PATCHED", torch.allclose(out, x @ w.t()))
    """)
    assert "UNPATCHED-FAILS" in out and "PATCHED True" in out


@pytest.mark.e2e
def test_patch_alltoall_dispatcher_without_cuda_streams():
    """The dispatcher's device-to-host step leaves split sizes that all_to_all_single takes."""
    out = run_check("""
        import tempfile
        import torch.distributed as dist
        from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher as D
        from primus.backends.megatron import cpu_patches
        dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)

        class State:  # the attributes the DtoH step reads, as preprocess() leaves them on CPU
            drop_and_pad, cuda_dtoh_point, cuda_dtoh_stream = False, "before_ep_alltoall", None
            input_splits, output_splits = torch.tensor([4]), torch.tensor([4])
            output_splits_tp, num_out_tokens, num_local_experts = torch.tensor([4]), torch.tensor(4), 1

        state = State()
        try:
            D._maybe_dtoh_and_synchronize(state, "before_ep_alltoall", torch.tensor([4]))
            print("UNPATCHED-OK")
        except (RuntimeError, AssertionError, AttributeError):
            print("UNPATCHED-FAILS")
        x = torch.arange(4.0)
        try:
            dist.all_to_all_single(torch.empty(4), x, output_split_sizes=state.output_splits,
                                   input_split_sizes=state.input_splits)
            print("TENSOR-SPLITS-OK")
        except TypeError:
            print("TENSOR-SPLITS-FAIL")
        cpu_patches.patch_alltoall_dispatcher_without_cuda_streams()
        assert not isinstance(D.cuda_dtoh_stream, type(None))  # __init__ will not build a CUDA stream
        D._maybe_dtoh_and_synchronize(state, "before_ep_alltoall", torch.tensor([4]))
        out = torch.empty(4)
        dist.all_to_all_single(out, x, output_split_sizes=state.output_splits, input_split_sizes=state.input_splits)
        print("PATCHED", type(state.input_splits).__name__, torch.equal(out, x), state.output_splits_tp.tolist())
    """)
    assert "UNPATCHED-FAILS" in out and "TENSOR-SPLITS-FAIL" in out
    assert "PATCHED ndarray True [4]" in out


@pytest.mark.e2e
def test_patch_identity_reduce_for_single_rank_groups():
    """MoE experts with biases at expert TP = EP = 1 (gpt-oss style) add the bias in place to the
    output of a one-rank all-reduce; upstream's autograd Function makes that a forbidden view."""
    out = run_check("""
        import tempfile
        import torch.distributed as dist
        from megatron.core import parallel_state
        from megatron.core.tensor_parallel import layers
        from primus.backends.megatron import cpu_patches
        dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
        parallel_state.initialize_model_parallel()
        def step():
            x = torch.ones(3, requires_grad=True)
            y = layers.reduce_from_tensor_model_parallel_region(x * 2)
            y += 1.0
            y.sum().backward()
            return x.grad.tolist()
        try:
            step()
            print("UNPATCHED-OK")
        except RuntimeError as exc:
            print("UNPATCHED-FAILS", "is a view" in str(exc))
        cpu_patches.patch_identity_reduce_for_single_rank_groups()
        print("PATCHED", step())
    """)
    assert "UNPATCHED-FAILS True" in out and "PATCHED [2.0, 2.0, 2.0]" in out


@pytest.mark.e2e
def test_patch_mla_without_transformer_engine():
    out = run_check("""
        from megatron.core.transformer import multi_latent_attention as mla
        from primus.backends.megatron import cpu_patches
        try:
            mla.HAVE_TE and isinstance(torch.nn.Linear(1, 1), mla.TELinear)  # MLASelfAttention.__init__'s test
            print("UNPATCHED-OK")
        except TypeError:
            print("UNPATCHED-FAILS")
        cpu_patches.patch_mla_without_transformer_engine()
        print("PATCHED", mla.HAVE_TE and isinstance(torch.nn.Linear(1, 1), mla.TELinear), mla.TELinear)
    """)
    assert "UNPATCHED-FAILS" in out and "PATCHED False None" in out


@pytest.mark.e2e
def test_patch_local_attention_mla_head_dims():
    """MLA's core attention with Q/K heads of 24 and V heads of 16 on the local spec."""
    out = run_check("""
        import tempfile
        import torch.distributed as dist
        from megatron.core import parallel_state
        from megatron.core.transformer.dot_product_attention import DotProductAttention
        from megatron.core.transformer.enums import AttnMaskType
        from megatron.core.transformer.transformer_config import TransformerConfig
        from primus.backends.megatron import cpu_patches
        from megatron.core import tensor_parallel
        cpu_patches.patch_current_device()
        cpu_patches.patch_rng_tracker()
        dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
        parallel_state.initialize_model_parallel()
        tensor_parallel.model_parallel_cuda_manual_seed(1)  # attention dropout forks the TP stream
        config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, attention_dropout=0.0,
                                   masked_softmax_fusion=False)
        def build():
            return DotProductAttention(config, 1, AttnMaskType.causal, "self", k_channels=24, v_channels=16)
        try:
            build()
            print("UNPATCHED-OK")
        except TypeError:
            print("UNPATCHED-FAILS")
        cpu_patches.patch_local_attention_mla_head_dims()
        attention = build()
        q, k, v = torch.randn(5, 2, 4, 24), torch.randn(5, 2, 4, 24), torch.randn(5, 2, 4, 16)
        mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1).view(1, 1, 5, 5)
        context = attention(q, k, v, mask)
        reference = torch.nn.functional.scaled_dot_product_attention(
            q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3), is_causal=True)  # scale 1/sqrt(24)
        print("PATCHED", tuple(context.shape), torch.allclose(context, reference.permute(2, 0, 1, 3).reshape(5, 2, 64), atol=1e-5))
    """)
    assert "UNPATCHED-FAILS" in out and "PATCHED (5, 2, 64) True" in out


@pytest.mark.e2e
def test_patch_torch_norm_sequence_parallel():
    out = run_check("""
        from megatron.core.transformer.torch_norm import WrappedTorchNorm
        from megatron.core.transformer.transformer_config import TransformerConfig
        from primus.backends.megatron import cpu_patches
        config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, tensor_model_parallel_size=2,
                                   sequence_parallel=True, normalization="RMSNorm", persist_layer_norm=False)
        try:
            WrappedTorchNorm(config, 8)
            print("UNPATCHED-OK")
        except AssertionError:
            print("UNPATCHED-FAILS")
        cpu_patches.patch_torch_norm_sequence_parallel()
        norm = WrappedTorchNorm(config, 8)
        plain = WrappedTorchNorm(TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2,
                                                   normalization="RMSNorm", persist_layer_norm=False), 8)
        print("PATCHED", type(norm).__name__, [getattr(p, "sequence_parallel", None) for p in norm.parameters()],
              [getattr(p, "sequence_parallel", None) for p in plain.parameters()])
    """)
    assert "UNPATCHED-FAILS" in out and "PATCHED RMSNorm [True] [None]" in out


@pytest.mark.e2e
def test_patch_torch_fsdp2_cpu_mesh():
    """megatron-core's FSDP2 wrapper shards a megatron-core layer on a CPU mesh (upstream asks for "cuda")."""
    out = run_check("""
        import tempfile
        import torch.distributed as dist
        from megatron.core import parallel_state
        from megatron.core.distributed import DistributedDataParallelConfig, TorchFullyShardedDataParallel
        from megatron.core.transformer.transformer_config import TransformerConfig
        from primus.backends.megatron import cpu_patches
        dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
        parallel_state.initialize_model_parallel()
        config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, use_cpu_initialization=True)
        def wrap():
            return TorchFullyShardedDataParallel(config, DistributedDataParallelConfig(), torch.nn.Linear(8, 8))
        try:
            wrap()
            print("UNPATCHED-OK")
        except (RuntimeError, AssertionError):
            print("UNPATCHED-FAILS")
        cpu_patches.patch_torch_fsdp2_cpu_mesh()
        model = wrap()
        print("PATCHED", model.device_mesh.device_type, type(model.module.weight).__name__)
    """)
    assert "UNPATCHED-FAILS" in out and "PATCHED cpu DTensor" in out


@pytest.mark.e2e
def test_patch_fsdp2_finish_grad_sync_signature():
    """finalize_model_grads calls finish_grad_sync(force_all_reduce=...) on every chunk, FSDP2's included."""
    out = run_check("""
        from megatron.core.distributed import TorchFullyShardedDataParallel
        from primus.backends.megatron import fsdp_patches
        chunk = TorchFullyShardedDataParallel.__new__(TorchFullyShardedDataParallel)
        try:
            chunk.finish_grad_sync(force_all_reduce=False)
            print("UNPATCHED-OK")
        except TypeError:
            print("UNPATCHED-FAILS")
        fsdp_patches.patch_fsdp2_finish_grad_sync_signature()
        chunk.finish_grad_sync(force_all_reduce=False)
        print("PATCHED")
    """)
    assert "UNPATCHED-FAILS" in out and "PATCHED" in out


@pytest.mark.e2e
def test_patch_fsdp2_optimizer_param_identity():
    """The optimizer's checkpoint finds an FSDP2 parameter by its local shard (torch >= 2.13's to_local
    returns a fresh view of a Parameter(DTensor))."""
    out = run_check("""
        import tempfile
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor
        from megatron.core.dist_checkpointing.optimizer import get_optim_param_to_id_map
        from primus.backends.megatron import fsdp_patches
        dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
        param = torch.nn.Parameter(distribute_tensor(torch.ones(4, 2), init_device_mesh("cpu", (1,)), [Shard(0)]))
        found = lambda: id(param._local_tensor) in get_optim_param_to_id_map([param])
        print("UNPATCHED", found())
        fsdp_patches.patch_fsdp2_optimizer_param_identity()
        print("PATCHED", found())
    """)
    assert "UNPATCHED False" in out and "PATCHED True" in out


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
