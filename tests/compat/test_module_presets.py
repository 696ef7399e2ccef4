"""Module presets under AMD Primus's names: they exist, hold Primus's own names only, and agree with AMD's files."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from primus.compat import TABLES, common
from primus.config.presets import CONFIGS_ROOT, load_with_extends

ROOT = Path(__file__).resolve().parents[2]
MEGATRON = CONFIGS_ROOT / "modules" / "megatron"
TORCHTITAN = CONFIGS_ROOT / "modules" / "torchtitan"
AMD_NAMES = {"megatron": ["pre_trainer.yaml", "sft_trainer.yaml", "trainer_base.yaml", "primus_turbo.yaml",
                          "torch_compile.yaml", "zero_bubble.yaml", "primus_pipeline.yaml"],
             "torchtitan": ["pre_trainer.yaml", "quantize.yaml"], "nemo_automodel": ["pre_trainer.yaml"]}


def merged(path):
    out = {}
    for layer in load_with_extends(path, "module preset"):
        out.update(layer.data)
    return out


@pytest.mark.parametrize("framework, name", [(f, n) for f, names in AMD_NAMES.items() for n in names])
def test_amd_module_preset_names_exist_and_use_our_names_only(framework, name):
    amd = CONFIGS_ROOT / "modules" / framework / "amd" / name
    data = merged(CONFIGS_ROOT / "modules" / framework / name) | (merged(amd) if amd.is_file() else {})
    amd_only = (set(TABLES[framework]) | set(common.RULES)) - {"stage"}  # a preset may name its stage
    assert not amd_only & set(data), "our presets never need a translation line"


AMD_MIRROR = Path(os.environ.get("AMD_PRIMUS_GIT_DIR", "/work/.mirror/AMD-AGI+Primus/repo"))


def test_amd_megatron_module_presets_say_what_amd_primus_says():
    """AMD Primus's defaults (its pre_trainer.yaml) for its files: the keys the issue's comparison named."""
    pre = yaml.safe_load((MEGATRON / "amd" / "pre_trainer.yaml").read_text())
    assert pre["eval_iters"] == 0 and pre["distributed_timeout_minutes"] == 60 and pre["lr"] == 2.0e-5
    assert pre["global_batch_size"] == 16 and pre["micro_batch_size"] == 2 and pre["seq_length"] == 1024
    assert merged(MEGATRON / "amd" / "sft_trainer.yaml")["stage"] == "sft"


def test_primus_megatron_module_presets_keep_primus_defaults():
    """Primus's own experiments (no AMD Primus-only key) read Primus's presets of the same names."""
    pre = merged(MEGATRON / "pre_trainer.yaml")
    assert pre["eval_iters"] == 10 and pre["lr"] == 3.0e-4 and "global_batch_size" not in pre
    assert "dataloader_type" not in pre


def test_amd_torchtitan_module_preset_says_what_amd_primus_says():
    """AMD Primus's TorchTitan defaults (its pre_trainer.yaml) in TorchTitan 0.3.0's names, AMD's keys none."""
    from primus.compat.dialect import SHARED
    from primus.compat.translate import covered

    pre = merged(TORCHTITAN / "amd" / "pre_trainer.yaml")
    assert pre["optimizer"] == {"eps": 1e-8, "lr": 8e-4, "name": "AdamW", "weight_decay": 0.1, "betas": [0.9, 0.95]}
    assert pre["compile"] == {"enable": True} and pre["activation_checkpoint"] == {"mode": "none"}
    assert pre["dataloader"] == {"dataset": "mock"}  # AMD's training.mock_data: true
    # TorchTitan 0.3.0's defaults, AMD Primus's values too: no line (decay_ratio null, seq_len 2048, 10000 steps)
    assert "lr_scheduler" not in pre and "training" not in pre
    rules = {**common.RULES, **TABLES["torchtitan"]}
    assert [key for key, rule, _ in covered(pre, rules) if rule.key not in SHARED] == []


def test_primus_torchtitan_module_preset_keeps_primus_defaults():
    """Primus's own TorchTitan experiments read Primus's preset of the same name, unchanged."""
    pre = merged(TORCHTITAN / "pre_trainer.yaml")
    assert pre["lr_scheduler"]["decay_ratio"] == 0.8 and pre["compile"] == {"enable": False}
    assert pre["optimizer"]["lr"] == 3.0e-4 and pre["activation_checkpoint"] == {"mode": "selective"}
    assert pre["training"]["seq_len"] == 8192 and pre["training"]["steps"] == 1000
    assert pre["dataloader"] == {"dataset": "c4"}


AUTOMODEL = CONFIGS_ROOT / "modules" / "nemo_automodel"
AUTOMODEL_MODELS = CONFIGS_ROOT / "models" / "nemo_automodel"


def test_amd_automodel_presets_say_what_amd_primus_says():
    """AMD Primus's Wan 2.2 operating point (its pre_trainer.yaml and wan2_2_t2v_a14b.yaml), in 0.7.0's names."""
    pre = merged(AUTOMODEL / "amd" / "pre_trainer.yaml")
    assert pre["optimizer"] == {"lr": 5e-5, "_target_": "torch.optim.AdamW", "weight_decay": 0.1,
                                "betas": [0.9, 0.95], "foreach": False, "fused": True}
    assert pre["data"]["dataloader"]["base_resolution"] == [512, 512] and pre["flow_matching"]["i2v_prob"] == 0.3
    assert pre["fsdp"]["activation_checkpointing"] is True
    assert pre["lr_scheduler"] == {"lr_decay_style": "cosine", "lr_warmup_steps": 0, "min_lr": 1e-6}
    assert "optim" not in pre and "wandb" not in pre and "trainable" not in pre  # AMD's spellings: none left
    model = merged(AUTOMODEL_MODELS / "amd" / "wan2_2_t2v_a14b.yaml")["model"]
    assert model["attention_backend"] == "aiter" and "mode" not in model  # model.mode is the stage here


def test_primus_automodel_presets_keep_primus_defaults():
    """Primus's own AutoModel experiments (tiny Wan, the A14B copies that write stage:) keep Primus's presets."""
    pre = merged(AUTOMODEL / "pre_trainer.yaml")
    assert pre["optimizer"]["lr"] == 1.0e-5 and pre["optimizer"]["betas"] == [0.9, 0.999]
    assert pre["flow_matching"]["i2v_prob"] == 0.0 and pre["fsdp"]["activation_checkpointing"] is False
    assert "lr_scheduler" not in pre
    model = merged(AUTOMODEL_MODELS / "wan2_2_t2v_a14b.yaml")
    assert model["data"]["dataloader"]["base_resolution"] == [832, 480]
    assert model["model"]["pretrained_model_name_or_path"] == "Wan-AI/Wan2.2-T2V-A14B-Diffusers"


@pytest.mark.e2e
@pytest.mark.skipif(not AMD_MIRROR.is_dir(), reason=f"AMD Primus mirror not available ({AMD_MIRROR})")
@pytest.mark.parametrize("framework", ["megatron", "torchtitan", "nemo_automodel"])
def test_module_presets_are_a_fresh_generation(framework):
    if framework != "megatron":  # the generator reads TorchTitan 0.3.0's defaults, AutoModel 0.7.0's key lists
        pytest.importorskip({"torchtitan": "torchtitan", "nemo_automodel": "nemo_automodel"}[framework])
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_module_presets.py"), "--git-dir",
                             str(AMD_MIRROR), "--framework", framework, "--check"], capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
