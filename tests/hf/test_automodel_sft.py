"""NeMo AutoModel's LLM recipe (LoRA) through `primus train`, and `primus export` merging the adapter.

The merge is checked against AutoModel itself: the exported (merged) model's loss on the held-out
split equals the validation loss AutoModel computed with the unmerged LoRA model at the last step.
"""
from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT
from tests.helpers import cli_in_workspace, read_metrics

EXAMPLE = ROOT / "examples" / "nemo_automodel" / "llama3_tiny-sft-lora.yaml"


def _held_out_loss(model_dir, data, tokenizer_dir) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    from primus.backends.nemo_automodel.sft_data import SFTDatasetConfig

    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    items = SFTDatasetConfig(path=str(data), tokenizer_path=str(tokenizer_dir), split="valid", seq_length=64).build()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(len(items)):
            item = items[i]
            labels = torch.tensor(item["labels"])
            logits = model(torch.tensor([item["input_ids"]])).logits[0]
            total += torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum").item()
            count += int((labels != -100).sum())
    return total / count


@pytest.mark.e2e
def test_lora_sft_trains_and_exports_merged(run_primus, workspace, tiny_cache, tmp_path):
    pytest.importorskip("nemo_automodel")
    pytest.importorskip("torchao")
    result = run_primus("train", EXAMPLE, "exp_name=lora", timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = workspace / "amd" / "root" / "lora"
    hf_dir = tiny_cache / "tiny_sft" / "hf" / "llama_tiny"
    info = (run_dir / "logs" / "pre_trainer" / "rank-0" / "info.log").read_text()
    assert f"LoRA (peft) of the Hugging Face checkpoint {hf_dir}" in info
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 31))
    losses = [r["loss"] for r in rows]
    assert min(losses[-5:]) < 0.6 * losses[0], losses
    assert result.stdout.count("[TRAIN] step=") == 30 and "[EVAL] step=30 " in info

    out = tmp_path / "merged"
    exported = run_primus("export", run_dir, "--to", "hf", out)
    assert exported.returncode == 0, exported.stderr[-3000:]
    from safetensors.torch import load_file

    merged, base = load_file(str(out / "model.safetensors")), load_file(str(hf_dir / "model.safetensors"))
    assert sorted(merged) == sorted(base)
    assert not merged["model.layers.0.self_attn.q_proj.weight"].equal(base["model.layers.0.self_attn.q_proj.weight"])
    assert merged["model.norm.weight"].equal(base["model.norm.weight"])  # LoRA touches linear layers only
    automodel_val = json.loads((run_dir / "checkpoints" / "validation.jsonl").read_text().splitlines()[-1])["val_loss"]
    assert _held_out_loss(out, tiny_cache / "tiny_sft" / "sft" / "messages.jsonl", hf_dir) == \
        pytest.approx(automodel_val, abs=1e-4)


@pytest.mark.e2e
def test_an_unknown_recipe_key_is_one_line_before_launch(workspace, tiny_cache):
    """Refused before any rank would start: ``primus train`` in this process."""
    pytest.importorskip("nemo_automodel")
    pytest.importorskip("torchao")
    result = cli_in_workspace(workspace, tiny_cache, "train", EXAMPLE, "step_scheduler.max_step=3")
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("primus: error:")]
    assert len(errors) == 1 and "modules.pre_trainer.step_scheduler" in errors[0] and "max_step" in errors[0]
    typo = cli_in_workspace(workspace, tiny_cache, "train", EXAMPLE, "step_schedular.max_steps=3")
    assert typo.returncode == 2 and "did you mean 'step_scheduler'" in typo.stderr
    assert not (workspace / "amd").exists()


def test_llm_recipe_on_cpu_sends_cuda_devices_to_the_cpu_and_restores_torch():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("the patch is a no-op where CUDA exists")
    from primus.backends.nemo_automodel.patches import llm_recipe_on_cpu

    with pytest.raises((AssertionError, AttributeError, RuntimeError)):
        torch.cuda.reset_peak_memory_stats()  # what AutoModel 0.7.0's setup() calls first
    with pytest.raises((AssertionError, RuntimeError)):
        torch.device("cuda", torch.cuda.current_device())  # what its build_model hands the model infrastructure
    with llm_recipe_on_cpu(setup=True):
        torch.cuda.reset_peak_memory_stats()
        device = torch.device("cuda", torch.cuda.current_device())
        assert torch.empty(2, device=device).device.type == "cpu"
        assert torch.nn.Linear(2, 2).to(device).weight.device.type == "cpu"
        assert torch.empty_like(torch.ones(1), device=0).device.type == "cpu"
        assert torch.cuda.max_memory_allocated() == 0
    with pytest.raises((AssertionError, RuntimeError)):
        torch.cuda.current_device()  # restored
