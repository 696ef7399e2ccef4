"""LoRA values are typed and ranged at validation (``lora.alpha=.inf``, ``lora.dim=true``, a rank of
10**12), and the rank is at most min(in, out) of every adapted linear: refused before launch, one line."""
from __future__ import annotations

import pytest

from tests.conftest import ROOT
from tests.helpers import cli_in_process

LORA = ROOT / "examples" / "megatron" / "llama3_tiny-sft-lora.yaml"


@pytest.mark.parametrize("override, fragment", [
    ("lora.alpha=.inf", "lora.alpha=inf: Input should be a finite number"),
    ("lora.alpha=.nan", "lora.alpha=nan: Input should be a finite number"),
    ("lora.dim=true", "lora.dim=True: Input should be a valid integer"),
    ("lora.dim=10^12", "lora.dim='10^12': Input should be a valid integer"),
    ("lora.dim=1000000000000", "lora.dim=1000000000000: Input should be less than or equal to 65536"),
    ("lora.dim=0", "lora.dim=0: Input should be greater than 0"),
    ("lora.dropout=1.5", "lora.dropout=1.5: Input should be less than 1"),
    ("lora.enabled=maybe", "lora.enabled='maybe': Input should be a valid boolean"),
    # the tiny model: hidden 128, 4 heads of 32, 2 KV groups, FFN 352 (gated)
    ("lora.dim=200", "lora.dim=200: the rank must be ≤ min(in, out) of every adapted linear; "
                     "linear_qkv is 128 -> 256, so at most 128"),
    ("lora.dim=129", "lora.dim=129: the rank must be ≤ min(in, out)"),
])
def test_bad_lora_values_are_one_line(override, fragment, tmp_path):
    result = cli_in_process("config", "validate", LORA, "--no-engine", override,
                            env={"PRIMUS_CACHE": str(tmp_path), "PRIMUS_WORKSPACE": str(tmp_path)})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("primus: error: command line ") and f"modules.pre_trainer.{fragment}" in lines[0]


def test_the_largest_rank_the_model_takes_is_accepted(tmp_path):
    result = cli_in_process("config", "validate", LORA, "--no-engine", "lora.dim=128",
                            env={"PRIMUS_CACHE": str(tmp_path), "PRIMUS_WORKSPACE": str(tmp_path)})
    assert result.returncode == 0, result.stderr


def test_only_the_targets_count():
    from types import SimpleNamespace

    from primus.backends.megatron.lora import LoRAConfig, adapted_shapes, check_rank

    args = SimpleNamespace(hidden_size=128, num_attention_heads=4, kv_channels=32, group_query_attention=True,
                           num_query_groups=2, multi_latent_attention=False, v_head_dim=128, num_experts=4,
                           moe_shared_expert_intermediate_size=None, moe_layer_freq=1, ffn_hidden_size=96,
                           swiglu=True, gated_linear_unit=False)
    assert adapted_shapes(args) == {"linear_proj": (128, 128), "linear_qkv": (128, 256)}  # routed experts only
    check_rank(LoRAConfig(enabled=True, dim=128, target_modules=["linear_fc2", "linear_proj"]), args, "m")
    args.moe_shared_expert_intermediate_size = 64
    assert adapted_shapes(args)["linear_fc2"] == (64, 128)
