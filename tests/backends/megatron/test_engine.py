"""Real megatron-core training on CPU over gloo: TP, PP (+interleaved), DP with the distributed
optimizer, checkpoint/resume. Tiny Llama (the shared llama3_tiny preset) on the learnable corpus.

Runs are module-scoped and reused across assertions to keep the wall time near a minute or two
(``base`` and ``runs``: conftest.py).
"""
from __future__ import annotations

import pytest

from tests.backends.megatron.conftest import losses

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.e2e

STEPS = 12


def assert_learns(records):
    values = losses(records)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert values[-1] < values[0] - 0.8, values  # the tiny corpus is learnable: loss clearly falls


def test_tp1_trains_and_reports_every_step(runs):
    records = runs("tp1", 1)
    assert_learns(records)
    first = records[0]
    assert first["tokens_per_sec"] > 0 and first["tflops"] > 0 and first["grad_norm"] > 0
    assert records[2]["lr"] > records[-1]["lr"] >= 3e-4  # cosine decay towards min_lr
    # the LR each step's update used (as TorchTitan reports), not the next step's: Megatron's
    # warmup runs iteration i at lr_warmup_init + lr * i / lr_warmup_iters, so 0, lr/2, lr
    assert [r["lr"] for r in records[:3]] == pytest.approx([0.0, 1.5e-3, 3e-3])
    log = (runs.root / "tp1" / "output.log").read_text()
    debug = (runs.root / "tp1" / "logs" / "pre_trainer" / "rank-0" / "debug.log").read_text()
    assert "megatron patch applied: patch_current_device: " in debug and "patch applied: patch_rng_tracker: " in debug
    assert "patch applied" not in log  # the run's debug log, not the console
    assert "derived gradient_accumulation_steps=2" in log
    assert (runs.root / "tp1" / "checkpoints" / "iter_0000012").is_dir()  # saved at the end


def test_tp2_matches_tp1(runs):
    tp1, tp2 = losses(runs("tp1", 1)), losses(runs("tp2", 2, tensor_model_parallel_size=2))
    assert tp2 == pytest.approx(tp1, rel=2e-3)


def test_tp2_with_sequence_parallel_matches_tp1(runs):
    """Norms see sequence shards; megatron-core's finalize_model_grads sums their weight gradients
    over TP for parameters marked sequence_parallel (patch_torch_norm_sequence_parallel)."""
    tp1 = losses(runs("tp1", 1))
    sp = losses(runs("tp2_sp", 2, tensor_model_parallel_size=2, sequence_parallel=True))
    assert sp == pytest.approx(tp1, rel=2e-3)


def test_pp2_trains(runs):
    assert_learns(runs("pp2", 2, pipeline_model_parallel_size=2))


def test_dp2_distributed_optimizer_matches_tp1(runs):
    tp1 = losses(runs("tp1", 1))
    dp2 = runs("dp2", 2, use_distributed_optimizer=True, save_interval=6)
    assert losses(dp2) == pytest.approx(tp1, rel=2e-3)


def test_resume_at_step_6_continues_the_same_loss_curve(runs):
    full = runs("dp2", 2, use_distributed_optimizer=True, save_interval=6)
    resumed = runs("dp2_resumed", 2, resume_from=("dp2", 6), use_distributed_optimizer=True, save_interval=6)
    assert [r["step"] for r in resumed] == list(range(7, STEPS + 1))
    assert losses(resumed) == pytest.approx(losses(full)[6:], abs=1e-5)
    assert [r["lr"] for r in resumed] == pytest.approx([r["lr"] for r in full[6:]])


def test_mock_data_with_interleaved_pipeline(runs, base):
    records = runs("vpp_mock", 2, mock_data=True, data_path=None, tokenizer_type=None, tokenizer_model=None,
                   num_layers=4, pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=1,
                   micro_batch_size=2, train_iters=4)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(r["loss"] > 0 for r in records)


def test_bf16_trains_and_resumes_from_its_checkpoint(runs):
    """bf16 goes through Megatron-LM's Float16Module + fp16 optimizer: every parameter (norms
    included) is bf16, so the optimizer's checkpoint maps onto the model and a resume continues."""
    full = runs("bf16", 1, bf16=True, save_interval=6)
    assert_learns(full)
    resumed = runs("bf16_resumed", 1, resume_from=("bf16", 6), bf16=True, save_interval=6)
    assert [r["step"] for r in resumed] == list(range(7, STEPS + 1))
    assert losses(resumed) == pytest.approx(losses(full)[6:], rel=1e-3)


def test_train_valid_test_data_paths(runs, tiny_indexed):
    """Megatron-LM's split-data arguments: one blend per split (no `split`), evaluated on the valid blend."""
    records = runs("split_paths", 1, data_path=None, split=None, train_data_path=[str(tiny_indexed)],
                   valid_data_path=[str(tiny_indexed)], test_data_path=None, train_iters=4, eval_interval=2,
                   eval_iters=1)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    log = (runs.root / "split_paths" / "output.log").read_text()
    assert "[EVAL] step=2 " in log and "[EVAL] step=4 " in log  # no data_path, no split: the valid blend was built


def test_pipeline_layout_places_uneven_stages(runs):
    """AMD's PP layouts ("Et*5|t*6|...|t*5,L"): megatron-core builds each stage's layers from the layout
    string, so 3 layers run on 2 stages (1 + 2), which the even split would refuse."""
    records = runs("pp2_layout", 2, num_layers=3, pipeline_model_parallel_size=2,
                   pipeline_model_parallel_layout="Et|tt,L")
    assert_learns(records)


def test_layers_that_do_not_divide_over_the_stages_train_on_the_derived_layout(runs):
    """3 layers on PP 2 without a layout (Megatron-LM refuses; AMD's 405B file is 126 on PP 8): the
    derived layout is "Et*1|t*2,L", so the run is the explicit layout's run, step for step."""
    derived = runs("pp2_derived", 2, num_layers=3, pipeline_model_parallel_size=2)
    explicit = runs("pp2_layout", 2, num_layers=3, pipeline_model_parallel_size=2,
                    pipeline_model_parallel_layout="Et|tt,L")
    assert losses(derived) == pytest.approx(losses(explicit), abs=1e-6)
    log = (runs.root / "pp2_derived" / "output.log").read_text()
    assert "pipeline_model_parallel_layout=Et*1|t*2,L" in log
