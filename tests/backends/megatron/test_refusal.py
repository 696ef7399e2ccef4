"""An argument that cannot be honoured here: accepted by `config validate` and `--dry-run` (the file
is valid Megatron-LM), refused by a real run before any rank starts: exit 2, one line naming it."""
from __future__ import annotations

import pytest

from tests.conftest import ROOT

pytest.importorskip("megatron.core")
EXAMPLE = ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml"


@pytest.mark.e2e  # the refusal comes from the run itself
def test_fp8_without_transformer_engine(run_primus, workspace):
    assert run_primus("config", "validate", EXAMPLE, "fp8=e4m3").returncode == 0
    assert run_primus("train", EXAMPLE, "--dry-run", "fp8=e4m3").returncode == 0
    result = run_primus("train", EXAMPLE, "exp_name=fp8", "fp8=e4m3")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower() and "Warning" not in line]
    assert errors == ["primus: error: modules.pre_trainer.fp8: 'e4m3' cannot be honoured here (FP8/FP4 and "
                      "per-layer precision recipes need Transformer Engine on a GPU, not wired here); ignoring it "
                      "would change the run, so training stops (remove it or set it to Megatron-LM's default, None)"]
    assert "Traceback" not in result.stderr
    assert not (workspace / "amd" / "root" / "fp8" / "metrics.jsonl").exists()
