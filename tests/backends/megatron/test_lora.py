"""LoRA on megatron-core (primus/backends/megatron/lora.py): a tiny LoRA SFT run from a HF checkpoint,
TP=2 against 1 rank, resume, and `primus export` merging the adapters; the ``lora`` block's errors.

The runs go through the real worker under torchrun (``tests.helpers``); nothing of megatron-core is mocked.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import cli_in_process, read_metrics, torchrun_module, train_with_torchrun

RANK, ALPHA = 8, 16
TARGETS = ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
LORA = {"enabled": True, "dim": RANK, "alpha": ALPHA, "dropout": 0.0, "dropout_position": "pre",
        "lora_A_init_method": "xavier", "lora_B_init_method": "zero", "target_modules": TARGETS}
WORKER = "tests.backends.megatron.lora_logits_worker"


@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory):
    pytest.importorskip("transformers")
    from primus.hf.tiny import build_tiny_hf_model

    return build_tiny_hf_model(tmp_path_factory.mktemp("hf") / "llama", "llama", seed=7)


@pytest.fixture(scope="module")
def instructions(tmp_path_factory):
    from primus.data.sft_tiny import write_instruction_files

    return write_instruction_files(tmp_path_factory.mktemp("instructions"))


def _params(hf_llama, instructions, **overrides):
    return {"hf_path": str(hf_llama), "sft_dataset_name": str(instructions["messages"]), "lora": dict(LORA),
            "train_iters": 16, "micro_batch_size": 4, "global_batch_size": 8, "seq_length": 64, "lr": 5e-3,
            "min_lr": 5e-3, "lr_warmup_iters": 0, "weight_decay": 0.1,  # frozen weights must not decay
            "bf16": False,
            "use_distributed_optimizer": False, "eval_interval": 1000, "save_interval": 8, "seed": 1234,
            **overrides}


def _analytic_trainable(hf_dir: Path) -> int:
    """r x (in + out) for every adapted linear of the HF config's Llama."""
    config = json.loads((hf_dir / "config.json").read_text())
    dim, heads, kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim, ffn = config.get("head_dim") or dim // heads, config["intermediate_size"]
    per_layer = ((dim + (heads + 2 * kv) * head_dim) + (heads * head_dim + dim) + (dim + 2 * ffn) + (ffn + dim))
    return RANK * per_layer * config["num_hidden_layers"]


def _checkpoint_tensors(run_dir: Path) -> dict:
    from primus.backends.checkpoint_io import read_dcp_tensors

    iters = sorted((run_dir / "checkpoints").glob("iter_*"))
    return read_dcp_tensors(iters[-1], lambda key: not key.startswith(("optimizer", "rng_state")))


def _torchrun(run_dir: Path, params: dict, nproc: int = 1, resume: bool = False) -> list[dict]:
    """The real worker under torchrun (a subprocess: the test process keeps no process group or port)."""
    result = train_with_torchrun(run_dir, "megatron", params, nproc=nproc, stage="sft", resume=resume,
                                 env={"PYTHONWARNINGS": "ignore"})
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return read_metrics(run_dir)


@pytest.fixture(scope="module")
def lora_run(hf_llama, instructions, tmp_path_factory):
    pytest.importorskip("megatron.core")
    run_dir = tmp_path_factory.mktemp("lora") / "run"
    return run_dir, _torchrun(run_dir, _params(hf_llama, instructions))


@pytest.mark.e2e
def test_lora_sft_trains_only_the_adapters(lora_run, hf_llama):
    from primus.hf.checkpoint import HFCheckpoint
    from primus.backends.megatron.hf_adapter import megatron_to_hf
    from primus.hf.config import model_spec_from_hf

    run_dir, records = lora_run
    losses = [r["loss"] for r in records]
    assert len(losses) == 16 and max(losses[-3:]) < 0.8 * losses[0], losses
    info = (run_dir / "logs" / "pre_trainer" / "rank-0" / "info.log").read_text()
    line = next(line for line in info.splitlines() if "LoRA: rank" in line)
    trainable = int(line.split("trainable ")[1].split(" of ")[0])
    assert trainable == _analytic_trainable(hf_llama), line
    assert f"LoRA: rank {RANK}, alpha {ALPHA}, targets {', '.join(TARGETS)}; trainable" in line and "%)" in line
    assert f"derived lora=rank {RANK}, alpha {ALPHA}, targets {', '.join(TARGETS)} (adapters y = W x + " \
           f"{ALPHA // RANK} * B A x" in info

    tensors = _checkpoint_tensors(run_dir)
    adapters = {k: v for k, v in tensors.items() if ".lora_" in k}
    assert len(adapters) == 2 * len(TARGETS), sorted(adapters)
    for key, value in adapters.items():
        if key.endswith("lora_B.weight"):
            assert value.abs().max() > 0, f"{key} never trained (B starts at zero)"
    base = {k: v for k, v in tensors.items() if ".lora_" not in k}
    checkpoint = HFCheckpoint(hf_llama)
    start = dict(checkpoint.tensors())
    after = megatron_to_hf(base, model_spec_from_hf(checkpoint.config))
    assert sorted(after) == sorted(start)
    for name, tensor in start.items():  # every base weight bit-identical to the HF checkpoint it started from
        assert after[name].equal(tensor), f"{name} changed: the base weights must stay frozen"


@pytest.mark.e2e
def test_export_merges_the_adapters_into_a_model_transformers_loads(lora_run, hf_llama, tmp_path):
    from safetensors.torch import load_file

    run_dir, _ = lora_run
    out = tmp_path / "merged"
    result = cli_in_process("export", run_dir, "--to", "hf", out)  # starts no rank
    assert result.returncode == 0, result.stderr[-3000:]
    merged, base = load_file(str(out / "model.safetensors")), load_file(str(hf_llama / "model.safetensors"))
    assert sorted(merged) == sorted(base)  # the standard HF names, no adapter tensors
    assert merged["model.norm.weight"].equal(base["model.norm.weight"])  # LoRA touches the linears only
    # o_proj / down_proj keep Megatron's layout: W + (alpha / dim) * B @ A by hand, from the raw checkpoint
    tensors = _checkpoint_tensors(run_dir)
    for hf_name, megatron in (("self_attn.o_proj", "self_attention.linear_proj"), ("mlp.down_proj", "mlp.linear_fc2")):
        a, b = (tensors[f"decoder.layers.{megatron}.lora_{x}.weight"][1] for x in "AB")
        want = base[f"model.layers.1.{hf_name}.weight"] + (ALPHA / RANK) * b @ a
        assert merged[f"model.layers.1.{hf_name}.weight"].allclose(want, atol=1e-6), hf_name
        assert not merged[f"model.layers.1.{hf_name}.weight"].equal(base[f"model.layers.1.{hf_name}.weight"])
    # every linear (QKV and SwiGLU layouts too): the merged HF model's logits = the unmerged Primus model's
    lora_json, result_json = tmp_path / "lora.json", tmp_path / "logits.json"
    lora_json.write_text(json.dumps(LORA))
    iter_dir = sorted((run_dir / "checkpoints").glob("iter_*"))[-1]
    worker = torchrun_module("megatron", 1, WORKER, hf_llama, iter_dir, out, lora_json, result_json, "1")
    assert worker.returncode == 0, (worker.stdout + worker.stderr)[-4000:]
    logits = json.loads(result_json.read_text())
    assert logits["adapter_effect"] > 1e-2, logits  # the adapters change the model
    assert logits["max_abs_diff"] < 1e-4, logits


@pytest.mark.e2e
def test_tp2_lora_matches_one_rank(lora_run, hf_llama, instructions, tmp_path):
    """Column-parallel B / row-parallel A with their TP reductions give the 1-rank loss curve (fp32)."""
    _, one_rank = lora_run
    run_dir = tmp_path / "tp2"
    params = _params(hf_llama, instructions, tensor_model_parallel_size=2, save_interval=16)
    tp2 = [r["loss"] for r in _torchrun(run_dir, params, nproc=2)]
    want = [r["loss"] for r in one_rank]
    assert len(tp2) == len(want)
    assert max(abs(a - b) / b for a, b in zip(tp2, want)) < 1e-4, (tp2, want)
    info = (run_dir / "logs" / "pre_trainer" / "rank-0" / "info.log").read_text()
    assert f"trainable {_analytic_trainable(hf_llama)} of" in info  # TP shards counted once
    # the TP=2 checkpoint holds the same global adapters as the 1-rank one (B of fc1 in the [gate; up] layout)
    one, two = _checkpoint_tensors(lora_run[0]), _checkpoint_tensors(run_dir)
    for key in [k for k in one if ".lora_" in k]:
        assert two[key].shape == one[key].shape, key
        assert (two[key] - one[key]).norm() <= 1e-3 * one[key].norm(), key


@pytest.mark.e2e
def test_resume_restores_base_and_adapters(lora_run, hf_llama, instructions, tmp_path):
    """The step-8 checkpoint (base + adapters + optimizer) continues the same loss curve."""
    import shutil

    source, full = lora_run
    run_dir = tmp_path / "resumed"
    shutil.copytree(source / "checkpoints" / "iter_0000008", run_dir / "checkpoints" / "iter_0000008")
    (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("8")
    records = _torchrun(run_dir, _params(hf_llama, instructions), resume=True)
    assert [r["step"] for r in records] == list(range(9, 17))
    assert [r["loss"] for r in records] == pytest.approx([r["loss"] for r in full[8:]], rel=1e-5)


AMD_EXPERIMENT = """\
work_group: amd
user_name: root
exp_name: llama_tiny-lora-sft
workspace: {workspace}
modules:
  post_trainer:
    framework: megatron
    config: sft_trainer.yaml
    overrides:
      stage: sft
      hf_path: {hf}
      sft_dataset_name: {data}
      sft_conversation_format: messages
      tokenizer_type: Llama3Tokenizer
      tokenizer_model: {hf}
      disable_wandb: true
      train_iters: 2
      micro_batch_size: 2
      global_batch_size: 2
      seq_length: 64
      bf16: false
      use_distributed_optimizer: false
      lora:
        enabled: true
        dim: 32
        alpha: 32
        dropout: 0.0
        dropout_position: pre
        lora_A_init_method: xavier
        lora_B_init_method: zero
        target_modules: [linear_qkv, linear_proj, linear_fc1, linear_fc2]
"""


@pytest.fixture
def amd_experiment(hf_llama, instructions, tmp_path):
    path = tmp_path / "llama_tiny-lora-sft.yaml"
    path.write_text(AMD_EXPERIMENT.format(workspace=tmp_path / "out", hf=hf_llama, data=instructions["messages"]))
    return path


def _cli(capsys, *args) -> tuple[int, str, str]:
    from primus.cli.main import main

    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_an_amd_lora_experiment_validates_plans_and_dry_runs(amd_experiment, capsys):
    code, out, err = _cli(capsys, "config", "validate", amd_experiment)
    assert code == 0, err
    assert out.startswith("OK ") and "translated lora=" not in out  # AMD's lora block is Primus's own
    code, out, err = _cli(capsys, "plan", amd_experiment)
    assert code == 0, err
    assert "parameters" in out
    code, out, err = _cli(capsys, "train", amd_experiment, "--dry-run")
    assert code == 0, err
    assert not (amd_experiment.parent / "out").exists()


@pytest.mark.parametrize("override, message", [
    ("lora.dropout_positon=post",
     "modules.post_trainer.lora.dropout_positon: unknown LoRA setting (did you mean 'dropout_position'?)"),
    ("lora.dropout_position=middle", "modules.post_trainer.lora.dropout_position='middle': Input should be 'pre' or 'post'"),
    ("lora.target_modules=[linear_qkv,lm_head]", "modules.post_trainer.lora.target_modules.1='lm_head'"),
    ("lora.dim=0", "modules.post_trainer.lora.dim=0: Input should be greater than 0"),
    ("sequence_parallel=true tensor_model_parallel_size=2", "modules.post_trainer.lora: LoRA with sequence_parallel is not supported yet"),
])
def test_a_wrong_lora_block_is_one_line_exit_2(amd_experiment, capsys, override, message):
    code, out, err = _cli(capsys, "config", "validate", amd_experiment, *override.split())
    errors = [line for line in err.splitlines() if line.startswith("primus: error:")]
    assert code == 2 and len(errors) == 1, err
    assert message in errors[0], errors[0]


def test_lora_off_is_said_and_leaves_the_module_alone(amd_experiment, capsys):
    code, out, err = _cli(capsys, "config", "validate", amd_experiment, "lora.enabled=false")
    assert code == 0, err
    assert "translated lora=" in out and "no effect (LoRA off)" in out


@pytest.mark.e2e
def test_moe_routed_experts_keep_no_adapter(instructions, tmp_path):
    """Mixtral: the attention linears are adapted, the experts' linear_fc1/fc2 stay frozen (said in the log)."""
    from primus.hf.tiny import build_tiny_hf_model

    hf = build_tiny_hf_model(tmp_path / "mixtral", "mixtral", seed=7)
    run_dir = tmp_path / "moe"
    records = _torchrun(run_dir, _params(hf, instructions, train_iters=3, save_interval=1000, moe_grouped_gemm=False))
    assert len(records) == 3
    info = (run_dir / "logs" / "pre_trainer" / "rank-0" / "info.log").read_text()
    config = json.loads((hf / "config.json").read_text())
    dim, heads, kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = dim // heads
    attention = RANK * ((dim + (heads + 2 * kv) * head_dim) + (heads * head_dim + dim)) * config["num_hidden_layers"]
    assert f"trainable {attention} of" in info
    experts = 2 * config["num_local_experts"] * config["num_hidden_layers"]
    assert f"{experts} linears of MoE routed experts on rank 0 stay frozen without adapters" in info
