"""Logits of a HF model vs the same weights loaded into megatron-core by Primus (fp32, within 1e-4)."""
from __future__ import annotations

import json

import pytest

from tests.helpers import torchrun_module

pytestmark = [pytest.mark.e2e]
WORKER = "tests.hf.megatron_logits_worker"


def _torchrun(nproc: int, *args, timeout: int = 300) -> None:
    result = torchrun_module("megatron", nproc, WORKER, *args, timeout=timeout)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


CASES = [
    ("llama", 1, 1), ("llama", 2, 1),   # GQA, fused QKV and SwiGLU sharded over TP
    ("qwen2", 2, 1),                     # + Q/K/V biases
    ("qwen3", 1, 1),                     # + per-head Q/K norms, head_dim apart from hidden / heads
    ("mixtral", 1, 1), ("mixtral", 1, 2),  # MoE: router + experts, experts split over EP
]


def _runs_on_cpu(family: str) -> bool:
    if family != "mixtral":
        return True
    from primus.backends.megatron import cpu_patches

    return hasattr(cpu_patches, "patch_moe_router_gemm_name")


@pytest.fixture(scope="module")
def compared(hf_models, tmp_path_factory):
    """``compared(family, tp, ep)`` -> the worker's result for that case. One launch per rank count runs all
    of its cases (the worker rebuilds megatron-core's parallel state for each): a launch costs more than a
    case."""
    root = tmp_path_factory.mktemp("megatron_logits")
    launched = set()

    def result(family: str, tp: int, ep: int) -> dict:
        nproc = max(tp, ep)
        if nproc not in launched:
            launched.add(nproc)
            cases = [(f, t, e) for f, t, e in CASES if max(t, e) == nproc and _runs_on_cpu(f)]
            _torchrun(nproc, *[word for f, t, e in cases for word in (hf_models(f), root / f"{f}-{t}-{e}.json", t, e)],
                      timeout=600)
        return json.loads((root / f"{family}-{tp}-{ep}.json").read_text())

    return result


@pytest.mark.parametrize("family, tp, ep", CASES)
def test_megatron_logits_match_transformers(family, tp, ep, compared):
    pytest.importorskip("megatron.core")
    if not _runs_on_cpu(family):
        pytest.skip("megatron-core MoE on CPU needs the Megatron backend's MoE CPU patches (not in this tree yet)")
    result = compared(family, tp, ep)
    assert result["shape"] == [2, 16, 512]
    assert result["scale"] > 0.1  # real logits, not zeros
    assert result["max_abs_diff"] < 1e-4, result
