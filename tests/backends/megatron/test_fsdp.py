"""PyTorch FSDP2 on megatron-core (``use_torch_fsdp2``): 2 CPU ranks over gloo, fp32, the tiny Llama.

FSDP2 trains what plain data parallelism trains (same data, same math: the losses agree to fp32
round-off), its torch_dist checkpoint resumes on the same curve (also with
``torch_fsdp2_reshard_after_forward: false``, ZeRO-2), and that checkpoint is megatron-core's
layout-free one: a plain DDP run resumes from it on the same curve too (which needs
``patch_fsdp2_swiglu_checkpoint_layout``).
"""
from __future__ import annotations

import pytest

from tests.backends.megatron.conftest import losses

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.e2e

STEPS = 4
# Megatron-LM's FSDP2 rules: an untied output layer, no gradient-accumulation fusion
UNTIED = {"untie_embeddings_and_output_weights": True, "gradient_accumulation_fusion": False, "save_interval": 2}
FSDP2 = {**UNTIED, "use_torch_fsdp2": True}


def test_fsdp2_matches_data_parallel(runs):
    dp = runs("dp2", 2, **UNTIED)
    fsdp2 = runs("fsdp2", 2, **FSDP2)
    assert [r["step"] for r in fsdp2] == [1, 2, 3, 4]
    assert losses(fsdp2) == pytest.approx(losses(dp), rel=1e-5)
    assert losses(fsdp2)[-1] < losses(fsdp2)[0] - 0.5  # it learns
    debug = (runs.root / "fsdp2" / "logs" / "pre_trainer" / "rank-0" / "debug.log").read_text()
    assert "patch_torch_fsdp2_cpu_mesh" in debug  # applied patches are logged in the rank's debug.log


def test_fsdp2_resumes_from_its_checkpoint_on_the_same_curve(runs):
    full = runs("fsdp2", 2, **FSDP2)
    resumed = runs("fsdp2_resumed", 2, resume_from=("fsdp2", 2), **FSDP2, torch_fsdp2_reshard_after_forward=False)
    assert [r["step"] for r in resumed] == [3, 4]
    assert losses(resumed) == pytest.approx(losses(full)[2:], abs=1e-5)
    assert [r["lr"] for r in resumed] == pytest.approx([r["lr"] for r in full[2:]])


def test_data_parallel_resumes_from_an_fsdp2_checkpoint(runs):
    full = runs("fsdp2", 2, **FSDP2)
    resumed = runs("dp2_from_fsdp2", 2, resume_from=("fsdp2", 2), **UNTIED)
    assert losses(resumed) == pytest.approx(losses(full)[2:], abs=1e-5)
