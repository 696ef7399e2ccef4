"""The seeds' examples at the seeds' paths, and AMD Primus's command-line spellings.

The blog's experiment (examples/megatron/configs/llama3.1_8B-pretrain.yaml) is AMD Primus's format
as the blog prints it: validate, plan on 8 ranks and dry-run unchanged; a copy shrunk by model keys
on the command line trains on CPU with mock data.
"""
import re

import pytest

from primus.cli.main import main
from tests.conftest import ROOT, TINY_EXAMPLE
from tests.helpers import read_metrics

BLOG = ROOT / "examples" / "megatron" / "configs" / "llama3.1_8B-pretrain.yaml"
WAN = ROOT / "examples" / "nemo_automodel" / "configs" / "MI355X" / "diffusion"
# The Megatron side needs Megatron-LM's argument table (train_data_path, no_load_optim: null, ...).
needs_megatron_lm_table = pytest.mark.skipif(
    __import__("importlib").util.find_spec("primus.backends.megatron.megatron_lm_args") is None,
    reason="the Megatron backend's Megatron-LM argument table has not landed")


def _plan_takes_nproc() -> bool:
    from primus.cli.main import build_parser

    plan = build_parser()._subparsers._group_actions[0].choices["plan"]
    return any("--nproc-per-node" in action.option_strings for action in plan._actions)


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_blog_file_is_the_blog_file():
    text = BLOG.read_text()
    for line in ("work_group: AMD", "framework: megatron", "model: llama3.1_8B.yaml", "train_iters: 50",
                 "micro_batch_size: 2", "global_batch_size: 128", "tensor_model_parallel_size: 1",
                 "pipeline_model_parallel_size: 1", "mock_data: true", "train_data_path: null",
                 "valid_data_path: null", "test_data_path: null"):
        assert re.search(rf"^\s*{re.escape(line)}$", text, re.M), line


@needs_megatron_lm_table
def test_the_blog_experiment_validates_plans_and_dry_runs_unchanged(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "config", "validate", BLOG)
    assert code == 0, err
    monkeypatch.setenv("GPUS_PER_NODE", "8")  # what `plan` assumes without --nproc-per-node
    code, out, err = run(capsys, "plan", BLOG, *(["--nproc-per-node", "8"] if _plan_takes_nproc() else []))
    assert code == 0, err
    assert "8,030,261,248 total" in out  # Llama 3.1 8B
    code, out, err = run(capsys, "train", BLOG, "--dry-run", "--nproc-per-node", "8")
    assert code == 0, err
    assert "--nproc-per-node=8" in out and not (tmp_path / "output").exists()


@needs_megatron_lm_table
@pytest.mark.e2e
def test_the_blog_experiment_shrunk_by_model_keys_trains_on_cpu(run_primus, workspace):
    pytest.importorskip("megatron.core")
    shrink = ["num_layers=2", "hidden_size=64", "ffn_hidden_size=128", "num_attention_heads=4",
              "num_query_groups=2", "vocab_size=512", "max_position_embeddings=1024"]
    # 3 steps of 4 samples keep the test short; a warm-up longer than the run is clamped, with a warning
    # and AMD's disable_last_saving on the command line: no checkpoint at the last step
    result = run_primus("train", BLOG, f"workspace={workspace}", *shrink, "train_iters=3", "global_batch_size=4",
                        "lr_warmup_iters=200", "disable_last_saving=true", timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = workspace / "AMD" / "root" / "llama3.1_8B-pretrain"
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    debug = (run_dir / "logs" / "pre_trainer" / "rank-0" / "info.log").read_text()
    assert "derived tokenizer_type=NullTokenizer (mock_data" in debug  # the Hub tokenizer is not needed
    assert "translated disable_last_saving=true → primus.save_last_checkpoint=false" in debug
    assert not list((run_dir / "checkpoints").glob("iter_*"))
    warnings = (run_dir / "logs" / "pre_trainer" / "rank-0" / "warning.log").read_text()
    assert "lr_warmup_iters" in warnings and "clamped" in warnings


@pytest.mark.parametrize("name", ["wan2_2_t2v_a14b-pretrain", "wan2_2_t2v_a14b-pretrain-bs32-acon",
                                  "wan2_2_t2v_a14b-pretrain-bs8-acoff", "wan2_2_t2v_a14b-finetune"])
def test_the_wan_seed_paths_hold_the_prs_operating_points(name):
    import yaml

    overrides = yaml.safe_load((WAN / f"{name}.yaml").read_text())["modules"]["pre_trainer"]["overrides"]
    assert overrides["data"]["dataloader"]["base_resolution"] == [512, 512]
    local, ac = overrides["step_scheduler"]["local_batch_size"], overrides["fsdp"]["activation_checkpointing"]
    assert (local, ac) == {"wan2_2_t2v_a14b-pretrain-bs8-acoff": (8, False), "wan2_2_t2v_a14b-finetune": (8, True)
                           }.get(name, (32, True))
    assert overrides["step_scheduler"]["global_batch_size"] == 8 * local  # one 8-GPU node


def test_amd_primus_spellings_of_train(capsys, monkeypatch, tmp_path):
    """``primus train --config EXP`` and ``primus train pretrain --config EXP`` are ``primus train EXP``."""
    pytest.importorskip("torchtitan")
    monkeypatch.chdir(ROOT)
    outputs = []
    for argv in (["train", TINY_EXAMPLE], ["train", "--config", TINY_EXAMPLE],
                 ["train", "pretrain", "--config", TINY_EXAMPLE, "training.steps=3"]):
        code, out, err = run(capsys, *argv, "--dry-run", f"workspace={tmp_path}")
        assert code == 0, err
        outputs.append([line for line in out.splitlines() if not line.startswith("command:")])
    assert outputs[0] == outputs[1] == outputs[2]
    code, _, err = run(capsys, "train", "finetune.yaml", "--config", TINY_EXAMPLE, "--dry-run")
    assert code == 2 and "give one experiment file" in err
