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
