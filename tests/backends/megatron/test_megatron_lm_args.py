"""The generated Megatron-LM argument table: its rows, and that it is what the generator makes
from Megatron-LM's source at the recorded commit."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from primus.backends.megatron import megatron_lm_args as table

REPO = Path(__file__).resolve().parents[3]
MIRROR = Path(os.environ.get("MEGATRON_LM_GIT_DIR", "/work/.mirror/NVIDIA+Megatron-LM/repo"))
ROWS = {row[0]: dict(zip(table.FIELDS, row)) for row in table.ROWS}


def test_one_row_per_argument_of_megatron_lm():
    # 671 = what Megatron-LM d3528a2's own parser holds on a stock install (no NVIDIA Kitchen),
    # counted by building that parser once while writing the generator
    assert len(table.ROWS) == len(ROWS) == 671
    assert table.SOURCE_COMMIT.startswith("d3528a2") and len(table.SOURCE_COMMIT) == 40
    assert all(len(row) == len(table.FIELDS) for row in table.ROWS)


@pytest.mark.parametrize("dest, expected", [
    ("no_load_optim", {"default": None, "action": "store_true", "options": ("--no-load-optim",)}),
    ("expert_model_parallel_size", {"type": "int", "default": 1}),
    ("expert_tensor_parallel_size", {"type": "int", "default": None}),
    ("num_experts", {"type": "int", "default": None, "options": ("--num-experts",)}),
    ("moe_router_topk", {"type": "int", "default": 2}),
    ("multi_latent_attention", {"default": False, "action": "store_true"}),
    ("train_data_path", {"default": None, "nargs": "*", "type": None}),
    # a store_false flag under its dest, as Megatron-LM's args namespace names it
    ("add_bias_linear", {"options": ("--disable-bias-linear",), "default": True, "action": "store_false"}),
    ("check_for_nan_in_loss_and_grad", {"default": True, "action": "store_false"}),
    ("position_embedding_type", {"choices": ("learned_absolute", "rope", "mrope", "relative", "none")}),
    ("attention_backend", {"type": "enum:AttnBackend", "default": "auto"}),
    ("moe_router_load_balancing_type", {"nargs": "+", "default": "aux_loss"}),  # a scalar default, as upstream
    ("initial_loss_scale", {"default": 2 ** 32}),
    ("rampup_batch_size", {"nargs": 3, "default": None}),
])
def test_known_rows(dest, expected):
    row = ROWS[dest]
    assert {k: row[k] for k in expected} == expected


def test_no_num_moe_experts_row():
    """megatron-core calls it num_moe_experts; Megatron-LM's argument is num_experts."""
    assert "num_moe_experts" not in ROWS


def test_regenerating_from_the_mirror_reproduces_the_committed_file(tmp_path):
    if not MIRROR.exists():
        pytest.skip(f"no Megatron-LM git mirror at {MIRROR} (set MEGATRON_LM_GIT_DIR); not available in CI")
    present = subprocess.run(["git", f"--git-dir={MIRROR}", "cat-file", "-e", f"{table.SOURCE_COMMIT}^{{commit}}"],
                             capture_output=True)
    if present.returncode:
        pytest.skip(f"the mirror at {MIRROR} lacks commit {table.SOURCE_COMMIT}")
    result = subprocess.run([sys.executable, str(REPO / "tools/gen_megatron_args.py"), "--git-dir", str(MIRROR),
                             "--commit", table.SOURCE_COMMIT[:7], "--check"], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
