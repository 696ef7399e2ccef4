"""Logits of a HF model vs the same weights loaded by TorchTitan's own state-dict adapter in a Primus run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e]
WORKER = Path(__file__).with_name("torchtitan_logits_worker.py")
REPO = Path(__file__).resolve().parents[2]


def test_torchtitan_logits_match_transformers(hf_models, instructions, tmp_path):
    pytest.importorskip("torchtitan")
    out = tmp_path / "result.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", str(WORKER),
               str(hf_models("llama")), str(instructions["messages"]), str(tmp_path / "run"), str(out)]
    result = subprocess.run(["timeout", "-k", "10", "300", *command], capture_output=True, text=True, env=env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    result = json.loads(out.read_text())
    assert result["shape"] == [2, 16, 512] and result["scale"] > 0.1
    assert result["max_abs_diff"] < 1e-4, result
