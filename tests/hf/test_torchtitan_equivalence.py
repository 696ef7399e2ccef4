"""Logits of a HF model vs the same weights loaded by TorchTitan's own state-dict adapter in a Primus run."""
from __future__ import annotations

import json

import pytest

from tests.helpers import torchrun_module

pytestmark = [pytest.mark.e2e]
WORKER = "tests.hf.torchtitan_logits_worker"


def test_torchtitan_logits_match_transformers(hf_models, instructions, tmp_path):
    pytest.importorskip("torchtitan")
    out = tmp_path / "result.json"
    result = torchrun_module("torchtitan", 1, WORKER, hf_models("llama"), instructions["messages"], tmp_path / "run", out)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    result = json.loads(out.read_text())
    assert result["shape"] == [2, 16, 512] and result["scale"] > 0.1
    assert result["max_abs_diff"] < 1e-4, result
