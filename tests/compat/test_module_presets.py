"""Module presets under AMD Primus's names: they exist, hold Primus's own names only, and agree."""
import pytest
import yaml

from primus.compat import TABLES, common
from primus.config.presets import CONFIGS_ROOT, load_with_extends

MEGATRON = CONFIGS_ROOT / "modules" / "megatron"
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
    data = merged(CONFIGS_ROOT / "modules" / framework / name)
    amd_only = (set(TABLES[framework]) | set(common.RULES)) - {"stage"}  # a preset may name its stage
    assert not amd_only & set(data), "our presets never need a translation line"


def test_pre_trainer_is_trainer_base_plus_a_run_length():
    """pre_trainer.yaml stays one file (others read it as plain YAML); it must not drift from trainer_base."""
    pre = yaml.safe_load((MEGATRON / "pre_trainer.yaml").read_text())
    base = merged(MEGATRON / "trainer_base.yaml")
    assert {k: v for k, v in pre.items() if k in base} == base
    assert {k: pre[k] for k in pre.keys() - base.keys()} == {"train_iters": 1000, "seq_length": 1024,
                                                             "lr_warmup_iters": 40}
    assert merged(MEGATRON / "sft_trainer.yaml")["stage"] == "sft"
