"""A resume whose checkpoint does not match the model is refused before any step.

One line names the first mismatching tensor and both shapes — fewer or more layers, another width
or FFN size, another LoRA rank, LoRA off — on TorchTitan (DCP ``.metadata``) and Megatron
(torch_dist); the run directory keeps its checkpoints and metrics as they were. A Megatron run
resumed with more iterations continues, on this launch's LR schedule.
"""
from __future__ import annotations

import shutil

import pytest
import torch

from primus.runtime.checkpoints import CheckpointMismatch, check_model_matches
from tests.conftest import ROOT, TINY_EXAMPLE
from tests.fault_tolerance.conftest import MEGATRON, TRAINED
from tests.helpers import read_metrics, train_in_workspace

LORA = ROOT / "examples" / "megatron" / "llama3_tiny-sft-lora.yaml"


def _save(path, tensors):
    import torch.distributed.checkpoint as dcp

    dcp.save(tensors, checkpoint_id=str(path))
    return path


@pytest.mark.parametrize("model, fragment", [
    ({"a": (4, 4)}, "tensor b (2) of the checkpoint has no place in the model"),
    ({"a": (4, 4), "b": (2,), "c": (1,)}, "tensor c (1) of the model is not in the checkpoint"),
    ({"a": (4, 8), "b": (2,)}, "tensor a is (4, 4) in the checkpoint, (4, 8) in the model"),
])
def test_the_first_mismatch_is_named_with_both_shapes(tmp_path, model, fragment):
    path = _save(tmp_path / "step-1", {"a": torch.zeros(4, 4), "b": torch.zeros(2), "optimizer.m": torch.zeros(3)})
    with pytest.raises(CheckpointMismatch) as refused:
        check_model_matches(path, model, lambda key: not key.startswith("optimizer"))
    assert str(refused.value).startswith(f"{path}: does not match the model: {fragment}; refused before any step")


def test_a_matching_checkpoint_passes(tmp_path):
    path = _save(tmp_path / "step-1", {"a": torch.zeros(4, 4), "optimizer.m": torch.zeros(3)})
    check_model_matches(path, {"a": (4, 4)}, lambda key: not key.startswith("optimizer"))


# -- end to end ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lora_workspace(tmp_path_factory, tiny_cache):
    pytest.importorskip("megatron.core")
    return train_in_workspace(tmp_path_factory.mktemp("lora-trained"), tiny_cache, LORA, TRAINED, "train_iters=2",
                              "save_interval=2", "eval_interval=100")


def _refused(run_primus, base, workspace, example, override):
    shutil.copytree(base, workspace)
    run_dir = workspace / "amd" / "root" / TRAINED
    metrics = read_metrics(run_dir)
    checkpoints = sorted(str(p.relative_to(run_dir)) for p in (run_dir / "checkpoints").rglob("*"))
    result = run_primus("train", example, "--resume", f"exp_name={TRAINED}", override)
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    text = result.stdout + result.stderr
    assert "Traceback" not in text and "[TRAIN]" not in text, text[-3000:]
    lines = [line for line in text.splitlines() if "does not match the model" in line]
    assert len(lines) == 1, text[-3000:]
    assert read_metrics(run_dir) == metrics  # no step ran
    assert sorted(str(p.relative_to(run_dir)) for p in (run_dir / "checkpoints").rglob("*")) == checkpoints
    return lines[0]


@pytest.mark.e2e
@pytest.mark.parametrize("override, fragment", [
    ("model.n_layers=1", "tensor layers.1.attention.qkv_linear.wq.weight (128, 128) of the checkpoint has no place "
                         "in the model"),
    ("model.n_layers=3", "tensor layers.2.attention.qkv_linear.wq.weight (128, 128) of the model is not in the "
                         "checkpoint"),
    ("model.dim=64", "tensor tok_embeddings.weight is (512, 128) in the checkpoint, (512, 64) in the model"),
    ("model.multiple_of=64", "tensor layers.0.feed_forward.w1.weight is (352, 128) in the checkpoint, (384, 128) in "
                             "the model"),
])
def test_torchtitan(override, fragment, titan_trained, run_primus, workspace):
    line = _refused(run_primus, titan_trained, workspace, TINY_EXAMPLE, override)
    assert f"checkpoints/step-2: does not match the model: {fragment}" in line, line


@pytest.mark.e2e
@pytest.mark.parametrize("override, fragment", [
    ("num_layers=1", "in the checkpoint, (1, "),
    ("hidden_size=64", "tensor embedding.word_embeddings.weight is (512, 128) in the checkpoint, (512, 64) in the "
                       "model"),
    ("ffn_hidden_size=256", "decoder.layers.mlp.linear_fc1.weight is (2, 704, 128) in the checkpoint, (2, 512, 128) "
                            "in the model"),
])
def test_megatron(override, fragment, megatron_trained, run_primus, workspace):
    line = _refused(run_primus, megatron_trained, workspace, MEGATRON, override)
    assert "checkpoints/iter_0000004: does not match the model: tensor " in line and fragment in line, line


@pytest.mark.e2e
@pytest.mark.parametrize("override, fragment", [
    ("lora.dim=8", "lora_A.weight is (2, 16, 128) in the checkpoint, (2, 8, 128) in the model"),
    ("lora.enabled=false", "lora_A.weight (2, 16, 128) of the checkpoint has no place in the model"),
])
def test_megatron_lora(override, fragment, lora_workspace, run_primus, workspace):
    assert fragment in _refused(run_primus, lora_workspace, workspace, LORA, override)


@pytest.mark.e2e
def test_megatron_resume_with_more_iterations_continues(megatron_trained, run_primus, workspace):
    shutil.copytree(megatron_trained, workspace)
    run_dir = workspace / "amd" / "root" / TRAINED
    result = run_primus("train", MEGATRON, "--resume", f"exp_name={TRAINED}", "train_iters=6", "save_interval=2",
                        "eval_interval=100")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    steps = [row["step"] for row in read_metrics(run_dir)]
    assert steps == [1, 2, 3, 4, 5, 6]
    info = (run_dir / "logs" / "pre_trainer" / "rank-0" / "info.log").read_text()
    assert "derived override_opt_param_scheduler=true" in info and "lr_decay_steps 32 -> 48" in info
    assert (run_dir / "checkpoints" / "iter_0000006" / ".metadata").is_file()
