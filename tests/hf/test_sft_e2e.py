"""The tiny SFT examples through `primus train`, then `primus export` (in this process: it starts no rank).

HF checkpoint -> SFT on Megatron / TorchTitan (the log names the checkpoint, the loss falls) ->
`primus export` -> transformers loads it and generates. A run whose step changes no weight
(Megatron: lr 0; TorchTitan: gradients clipped to norm 0, no weight decay) exports bit-identical
tensors: HF -> Primus -> HF is exact, for a TP=2 Megatron checkpoint too.
"""
from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT
from tests.helpers import cli_in_workspace, read_evals, read_metrics

pytestmark = [pytest.mark.e2e]
MEGATRON = ROOT / "examples" / "megatron" / "llama3_tiny-sft.yaml"
TORCHTITAN = ROOT / "examples" / "torchtitan" / "llama3_tiny-sft.yaml"


def _losses(run_dir):
    return [r["loss"] for r in read_metrics(run_dir)]


def _assert_same_tensors(exported, source):
    from safetensors.torch import load_file

    def tensors(folder):
        out = {}
        for file in sorted(folder.glob("*.safetensors")):
            out.update(load_file(str(file)))
        return out

    got, want = tensors(exported), tensors(source)
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert got[name].equal(tensor), f"{name} differs after the round trip"
    exported_config = json.loads((exported / "config.json").read_text())
    source_config = json.loads((source / "config.json").read_text())
    assert exported_config == {**source_config, "dtype": "float32"}


def _generate(folder) -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(folder))
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 plus 3?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    assert out.shape[1] > prompt["input_ids"].shape[1]
    return tokenizer.decode(out[0, prompt["input_ids"].shape[1]:])


@pytest.mark.parametrize("example, overrides", [
    (MEGATRON, []),
    (TORCHTITAN, []),
])
def test_tiny_sft_trains_from_the_hf_checkpoint_and_exports_a_model_that_generates(
        example, overrides, run_primus, workspace, tiny_cache, tmp_path):
    pytest.importorskip("transformers")
    backend = example.parent.name
    name = f"sft-{backend}"
    result = run_primus("train", example, f"exp_name={name}", *overrides, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = workspace / "amd" / "root" / name
    info = (run_dir / "logs" / "pre_trainer" / "rank-0" / "info.log").read_text()
    hf_dir = tiny_cache / "tiny_sft" / "hf" / "llama_tiny"
    assert f"Hugging Face checkpoint {hf_dir}" in info
    losses = _losses(run_dir)
    assert len(losses) == 30 and min(losses[-5:]) < 0.5 * losses[0], losses
    evals = [row["loss"] for row in read_evals(run_dir)]  # validation through the metrics path
    assert len(evals) >= 3 and evals[-1] < 0.6 * evals[0], evals
    assert info.count("[EVAL] step=") == len(evals)

    out = tmp_path / "hf"
    exported = cli_in_workspace(workspace, tiny_cache, "export", run_dir, "--to", "hf", out)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert "step 30" in exported.stdout
    answer = _generate(out)
    assert answer.strip(), answer
    again = cli_in_workspace(workspace, tiny_cache, "export", run_dir, "--to", "hf", out)
    assert again.returncode == 2 and "never overwrites" in again.stderr


_MEGATRON_NO_UPDATE = ["train_iters=1", "lr=0", "min_lr=0", "lr_warmup_iters=0", "save_interval=1", "eval_interval=100"]
_TORCHTITAN_NO_UPDATE = ["training.steps=1", "training.max_norm=0", "optimizer.weight_decay=0", "checkpoint.interval=1",
                         "validator.enable=false"]


@pytest.mark.parametrize("example, nproc, overrides", [
    (MEGATRON, 2, ["tensor_model_parallel_size=2", *_MEGATRON_NO_UPDATE]),
    (MEGATRON, 2, ["pipeline_model_parallel_size=2", *_MEGATRON_NO_UPDATE]),
    (TORCHTITAN, 2, _TORCHTITAN_NO_UPDATE),  # FSDP: each rank loads and saves its shard (1 rank: a subset)
], ids=["megatron-tp2", "megatron-pp2", "torchtitan-fsdp2"])
def test_hf_to_primus_to_hf_is_bit_identical(example, nproc, overrides, run_primus, workspace, tiny_cache, tmp_path):
    pytest.importorskip("transformers")
    name = f"roundtrip-{example.parent.name}-{nproc}-{len(overrides)}-{overrides[0].split('=')[0]}"
    result = run_primus("train", example, "--nproc-per-node", nproc, f"exp_name={name}", *overrides, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = tmp_path / "hf"
    exported = cli_in_workspace(workspace, tiny_cache, "export", workspace / "amd" / "root" / name, "--to", "hf", out)
    assert exported.returncode == 0, exported.stderr[-3000:]
    _assert_same_tensors(out, tiny_cache / "tiny_sft" / "hf" / "llama_tiny")


@pytest.mark.parametrize("example, overrides", [
    (ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml", ["train_iters=2", "save_interval=2"]),
    (ROOT / "examples" / "torchtitan" / "llama3_tiny-pretrain.yaml", ["training.steps=2", "checkpoint.interval=2"]),
], ids=["megatron", "torchtitan"])
def test_a_pretraining_run_exports_too(example, overrides, run_primus, workspace, tiny_cache, tmp_path):
    """No HF source: config.json comes from the run's ModelSpec, the tokenizer from the run's."""
    pytest.importorskip("transformers")
    name = f"pretrain-export-{example.parent.name}"
    result = run_primus("train", example, f"exp_name={name}", *overrides, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = tmp_path / "hf"
    exported = cli_in_workspace(workspace, tiny_cache, "export", workspace / "amd" / "root" / name, "--to", "hf", out,
                                "--step", "2")
    assert exported.returncode == 0, exported.stderr[-3000:]
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = AutoModelForCausalLM.from_pretrained(str(out)), AutoTokenizer.from_pretrained(str(out))
    ids = tokenizer("the cat sees the red ball", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert model.generate(ids, max_new_tokens=4, do_sample=False).shape[1] > ids.shape[1]
    missing = cli_in_workspace(workspace, tiny_cache, "export", workspace / "amd" / "root" / name, "--to", "hf",
                               tmp_path / "x", "--step", "7")
    assert missing.returncode == 2 and "--step 7: no checkpoint of that step" in missing.stderr
