"""The compat tables against the sources they were read from (skipped where the mirror is absent).

Every key of AMD Primus's (fd1eeab) Megatron presets is a Megatron-LM d3528a2 argument (the
Megatron backend's generated table) or in ``primus/compat/megatron.py``; every key of its TorchTitan
presets is a TorchTitan 0.3.0 ``Trainer.Config`` path, a Primus TorchTitan key, or in
``primus/compat/torchtitan.py``. A key in neither would reach the engine and be refused as unknown.
"""
import subprocess
from pathlib import Path

import pytest
import yaml

from primus.compat import TABLES, common

MIRROR = Path("/work/.mirror/AMD-AGI+Primus/repo")
COMMIT = "fd1eeab"


def _amd(path: str) -> dict:
    out = subprocess.run(["git", f"--git-dir={MIRROR}", "show", f"{COMMIT}:{path}"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout) or {}


def _amd_files(folder: str) -> list[str]:
    out = subprocess.run(["git", f"--git-dir={MIRROR}", "ls-tree", "--name-only", f"{COMMIT}:{folder}"],
                         capture_output=True, text=True)
    return [f"{folder}/{name}" for name in out.stdout.split() if name.endswith(".yaml")]


needs_mirror = pytest.mark.skipif(not MIRROR.is_dir(), reason="AMD Primus mirror absent (not available in CI)")


def _covered(key: str, rules: dict) -> bool:
    parts = key.split(".")
    return any(".".join(parts[:i]) in rules or f"{'.'.join(parts[:i])}.*" in rules for i in range(1, len(parts) + 1))


@needs_mirror
def test_every_amd_megatron_preset_key_is_megatron_lm_or_translated():
    table = pytest.importorskip("primus.backends.megatron.megatron_lm_args")
    from primus.backends.megatron.schema import option_aliases

    megatron_lm = {row[0] for row in table.ROWS} | set(option_aliases())  # dests and option spellings
    known = megatron_lm | set(TABLES["megatron"]) | set(common.RULES) | {"extends", "bases"} | _post_training_keys()
    files = [*_amd_files("primus/configs/modules/megatron"), "primus/configs/modules/module_base.yaml",
             *_amd_files("primus/configs/models/megatron")]
    missing = {key: path for path in files for key in _amd(path) if key not in known}
    assert not missing, f"AMD Primus keys neither Megatron-LM's nor translated: {missing}"


def test_sft_keys_the_backend_reads_are_left_to_it():
    """hf_path / sft_dataset_name / enable_packed_sequences are the post-training's own; only AMD's
    'messages' value of sft_conversation_format is translated."""
    assert not {"hf_path", "sft_dataset_name", "enable_packed_sequences"} & set(TABLES["megatron"])


def test_no_compat_rule_shadows_a_megatron_lm_argument():
    """compat runs first: a rule for one of Megatron-LM's own arguments would hijack it."""
    table = pytest.importorskip("primus.backends.megatron.megatron_lm_args")
    from primus.backends.megatron.schema import option_aliases

    megatron_lm = {row[0] for row in table.ROWS} | set(option_aliases())
    # tokenizer_type: only its AMD values (Llama3Tokenizer, ...) are translated; the rest pass through.
    # norm_epsilon / apply_layernorm_1p: option spellings AMD files use over a preset's dest (precedence)
    # fp4_recipe: AMD's mxfp4 value only. check_for_nan_in_loss: excluded from Megatron-LM's arguments.
    own = {"tokenizer_type", "norm_epsilon", "apply_layernorm_1p", "fp4_recipe", "check_for_nan_in_loss"}
    assert set(TABLES["megatron"]) & megatron_lm <= own


def _post_training_keys() -> set[str]:
    """AMD Primus's SFT keys the Megatron backend reads itself (hf_path, sft_dataset_name, ...)."""
    try:
        from primus.backends.megatron.post_training import KEYS
    except ImportError:
        return {"hf_path", "sft_dataset_name", "sft_conversation_format", "enable_packed_sequences"}
    return set(KEYS)


def _leaves(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value:
            yield from _leaves(value, dotted)
        else:
            yield dotted


@needs_mirror
def test_every_amd_torchtitan_preset_key_is_torchtitan_030_or_translated():
    pytest.importorskip("torchtitan")
    from primus.backends.torchtitan.config import PRIMUS_KEYS
    from primus.backends.torchtitan.patches import apply_patches
    from primus.plan.model import ModelSpec

    apply_patches()
    import dataclasses

    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
    from torchtitan.trainer import Trainer

    def paths(obj, prefix=""):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            dotted = f"{prefix}.{f.name}" if prefix else f.name
            yield dotted
            if dataclasses.is_dataclass(value):
                yield from paths(value, dotted)

    tt030 = set(paths(Trainer.Config(dataloader=HuggingFaceTextDataLoader.Config())))
    ours = {"optimizer.name", "optimizer.lr", "optimizer.betas", "optimizer.eps", "optimizer.weight_decay",
            "activation_checkpoint.mode", "activation_checkpoint.force_recompute_mm_shapes_by_fqns"}
    rules = {**TABLES["torchtitan"], **common.RULES}
    files = [*_amd_files("primus/configs/modules/torchtitan"), *_amd_files("primus/configs/models/torchtitan")]
    missing = {}
    for path in files:
        for key in _leaves({k: v for k, v in _amd(path).items() if k not in ("extends", "bases")}):
            top = key.split(".")[0]
            if key in tt030 or key in ours or top in PRIMUS_KEYS and top != "model" or _covered(key, rules):
                continue
            if key in ("model.name", "model.flavor") or key.split(".")[-1] in ModelSpec.model_fields:
                continue  # the model preset's keys (a registry model, or the neutral ModelSpec's)
            missing[key] = path
    assert not missing, f"TorchTitan 0.2 keys neither 0.3.0's nor translated: {missing}"
