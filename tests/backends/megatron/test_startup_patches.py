"""The two patches that take megatron-core's fixed costs off a CPU process (``benchmarks/megatron_startup.py``
measures them): fusions compiled on first call, not at import; the first save's results queue forked."""
from __future__ import annotations

import multiprocessing
import subprocess
import sys

import pytest

pytest.importorskip("megatron.core")


def test_lazy_compile_compiles_once_on_the_first_call_with_the_same_options():
    from primus.backends.megatron.lazy_fusions import lazy_compile

    compiled = []

    def compile_now(fn, **options):
        compiled.append((fn.__name__, options))
        return lambda *args: ("compiled", fn(*args))

    def bias_gelu(x, bias):
        """doc"""
        return x + bias

    lazy = lazy_compile(compile_now)
    plain, with_options = lazy(bias_gelu), lazy(dynamic=False)(bias_gelu)
    assert compiled == [] and plain.__name__ == "bias_gelu" and plain.__doc__ == "doc"
    assert plain(1, 2) == ("compiled", 3) and plain(2, 2) == ("compiled", 4)
    assert with_options(1, 1) == ("compiled", 2)
    assert compiled == [("bias_gelu", {}), ("bias_gelu", {"dynamic": False})]


PROBE = """
import sys, torch
real = torch.compile
import primus.backends.megatron
import megatron.core, megatron.core.models.gpt, megatron.core.optimizer
from megatron.core import jit
from megatron.core.fusions import fused_bias_swiglu
print(torch.compile is real, "torch._inductor.compile_fx" in sys.modules, "torch._dynamo" in sys.modules,
      jit.jit_fuser.__qualname__, fused_bias_swiglu.bias_swiglu.__wrapped__.__name__)
"""


@pytest.mark.e2e
def test_megatron_core_imports_without_dynamo_or_inductor_on_a_cpu_host():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CPU-host patch")
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", PROBE], capture_output=True, text=True, check=True,
                         timeout=300).stdout.split()
    assert out == ["True", "False", "False", "lazy_compile.<locals>.decorate", "bias_swiglu"]


def test_the_checkpoint_results_queue_is_one_forked_manager_per_process():
    from megatron.core.dist_checkpointing.strategies import filesystem_async
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.storage import WriteResult

    from primus.backends.megatron.cpu_patches import patch_checkpoint_results_queue_by_fork
    from primus.runtime.patches import Swaps

    upstream = filesystem_async._get_write_results_queue
    swaps = Swaps()
    patch_checkpoint_results_queue_by_fork(swaps)
    try:
        queue = filesystem_async._get_write_results_queue()
        assert queue is filesystem_async._get_write_results_queue()
        assert isinstance(queue._manager._process, multiprocessing.context.ForkProcess)
        results = {0: [WriteResult(index=MetadataIndex("w"), size_in_bytes=4, storage_data=_StorageInfo("f", 0, 4))]}
        queue.put(results)
        assert queue.get() == results
        queue._manager.shutdown()
    finally:
        swaps.restore()
    assert filesystem_async._get_write_results_queue is upstream
