"""Megatron-LM's own launch scripts as experiment files (examples/megatron/megatron_lm/): they validate
and plan the parameter counts of the models they train, and (where the Megatron-LM mirror is here) say
exactly the flags of the scripts at d3528a2."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from primus.runtime.capabilities import CAPABILITIES, NOWHERE
from tests.conftest import ROOT
from tests.helpers import cli_in_process

FILES = ROOT / "examples" / "megatron" / "megatron_lm"
MIRROR = Path(os.environ.get("MEGATRON_LM_GIT_DIR", "/work/.mirror/NVIDIA+Megatron-LM/repo"))
SCRIPTS = {"gpt3_175b-pretrain.yaml": "examples/gpt3/train_gpt3_175b_distributed.sh",
           "mixtral_8x7b-pretrain.yaml": "examples/mixtral/train_mixtral_8x7b_distributed.sh",
           "llama3_8b_h100_fp8-pretrain.yaml": "examples/llama/train_llama3_8b_h100_fp8.sh"}


def gpt3_175b() -> int:
    """GPT-3 175B as Megatron-LM builds it: 96 layers of 12288, biases and LayerNorms, learned positions
    (2048), the GPT-2 vocabulary (50257) padded to a multiple of 128 x TP 8, tied output."""
    layers, h, positions, vocab = 96, 12288, 2048, 51200
    per_layer = 4 * h * h + 4 * h + 8 * h * h + 5 * h + 4 * h  # attention + biases, MLP + biases, 2 LayerNorms
    return layers * per_layer + vocab * h + positions * h + 2 * h


@pytest.mark.parametrize("name, nodes, total", [
    ("gpt3_175b-pretrain.yaml", 16, gpt3_175b()),  # 174.6B: "175B"
    ("mixtral_8x7b-pretrain.yaml", 4, 46_702_792_704),  # Mixtral 8x7B's published 46.7B
    ("llama3_8b_h100_fp8-pretrain.yaml", 1, 8_030_261_248),  # Llama 3 8B's published 8.03B
])
def test_each_script_validates_and_plans_its_models_parameters(name, nodes, total, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    exp = FILES / name
    validate = cli_in_process("config", "validate", exp, "--device", "h100")
    fp8_waits = "fp8" in name and CAPABILITIES["megatron.fp8"].needs == NOWHERE
    if fp8_waits:  # refused on every device until FP8 is wired; the script with another DTYPE is admitted
        assert validate.returncode == 2 and "modules.pre_trainer.fp8: 'hybrid' cannot be honoured on h100" in \
            validate.stderr
        validate = cli_in_process("config", "validate", exp, "--device", "h100", "fp8_format=null")
    assert validate.returncode == 0, validate.stderr
    assert "admitted on h100 (not on this host: assumed" in validate.stdout
    plan = cli_in_process("plan", exp, "--nproc-per-node", "8", "-N", nodes, "--device", "h100")
    assert plan.returncode in (0, 1), plan.stderr  # 1: not admitted (FP8) or a memory verdict
    assert f"parameters        {total:,} total" in plan.stdout


def test_a_plan_without_the_tokenizer_files_says_which_vocabulary_it_took(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    gpt3 = cli_in_process("plan", FILES / "gpt3_175b-pretrain.yaml", "--nproc-per-node", "8", "-N", "16")
    assert "vocabulary        50257 (GPT-2's published BPE vocabulary: GPT2BPETokenizer's " \
           "./data/gpt3/gpt2-vocab.json is not here; the run reads the tokenizer)" in gpt3.stdout
    unknown = cli_in_process("plan", FILES / "mixtral_8x7b-pretrain.yaml", "--nproc-per-node", "8", "-N", "4",
                             "tokenizer_type=SentencePieceTokenizer")
    assert "vocabulary        unknown (SentencePieceTokenizer's ./data/mixtral/tokenizer.model is not here: the plan " \
           "counts no embedding or output layer)" in unknown.stdout
    assert f"parameters        {46_702_792_704 - 2 * 32000 * 4096:,} total" in unknown.stdout


def _script_flags(script: str) -> dict[str, list[str]]:
    """``--flag value...`` of the script's argument arrays, for the defaults it runs with: torchrun's own
    flags, the W&B block that needs WANDB_API_KEY and the llama script's real-data branch (its default is
    MOCK) left out."""
    text = subprocess.run(["git", f"--git-dir={MIRROR}", "show", f"d3528a2:{script}"], capture_output=True,
                          text=True, check=True).stdout
    text = re.sub(r'if \[ -n "\$\{WANDB_API_KEY\}" \].*?\nfi\n', "", text, flags=re.S)
    text = re.sub(r"else\n    # Settings for real data.*?\nfi\n", "", text, flags=re.S)
    flags: dict[str, list[str]] = {}
    for name, block in re.findall(r"^\s*(\w+)\+?=\(\n(.*?)\n\s*\)", text, re.S | re.M):
        if name == "DISTRIBUTED_ARGS":
            continue
        for line in block.splitlines():
            line = line.split(" #")[0].replace("\\", "").strip()
            line = line[1:-1] if line[:1] == line[-1:] == '"' else line  # "--fp8-format hybrid": one array item
            for word in (shlex.split(line) if line and not line.startswith("#") else []):
                if word.startswith("--"):
                    flags[word] = current = []
                else:
                    current.append(word)
    return flags


@pytest.mark.skipif(not MIRROR.is_dir(), reason=f"Megatron-LM mirror not available ({MIRROR}; MEGATRON_LM_GIT_DIR)")
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_files_say_exactly_the_scripts_flags(name):
    flags = _script_flags(SCRIPTS[name])
    overrides = yaml.safe_load((FILES / name).read_text())["modules"]["pre_trainer"]["overrides"]
    spelled = {key.replace("_", "-") for key in overrides}
    left_out = {"--rampup-batch-size"}  # Megatron-LM d3528a2 refuses it with --train-iters (the file says so)
    added = {"tokenizer-type"} if "gpt3" in name else set()  # its build_tokenizer needs one (the file says so)
    assert {flag[2:] for flag in flags if flag not in left_out} == spelled - added
    for flag, values in flags.items():
        key = flag[2:].replace("-", "_")
        if flag in left_out or key not in overrides or not values or values[0].startswith("$"):
            continue
        value = overrides[key]
        assert str(value if not isinstance(value, list) else " ".join(map(str, value))) == " ".join(values) or \
            float(value) == float(values[0]), (flag, values, value)
