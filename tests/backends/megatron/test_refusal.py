"""An argument that cannot run on this host: accepted by `config validate` and `--dry-run` (the file is
valid Megatron-LM), refused by a real run before any rank starts: exit 2, one line naming it and why."""
from __future__ import annotations

import pytest

from tests.conftest import ROOT

pytest.importorskip("megatron.core")
EXAMPLE = ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml"


@pytest.mark.e2e  # the refusal comes from the launch itself
@pytest.mark.parametrize("setting, line", [
    (["fp8=e4m3"], "primus: error: modules.pre_trainer.fp8: 'e4m3' cannot run on a CPU host (FP8 training runs in "
                 "Transformer Engine's layers on a GPU; megatron-core's local layers have no FP8)"),
    (["context_parallel_size=2", "--nproc-per-node", "2"],
     "primus: error: modules.pre_trainer.context_parallel_size: 2 cannot run on a CPU host (context parallelism "
     "splits attention in Transformer Engine's TEDotProductAttention on a GPU; megatron-core's local attention "
     "refuses it)"),
], ids=["fp8", "context_parallel"])
def test_transformer_engine_settings_are_refused_on_cpu(run_primus, workspace, setting, line):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU host: admission asks its GPU and Transformer Engine")
    assert run_primus("config", "validate", EXAMPLE, setting[0]).returncode == 0
    assert run_primus("train", EXAMPLE, "--dry-run", *setting).returncode == 0
    result = run_primus("train", EXAMPLE, "exp_name=te", *setting)
    assert result.returncode == 2
    errors = [text for text in result.stderr.splitlines() if "error" in text.lower() and "Warning" not in text]
    assert errors == [line]
    assert "Traceback" not in result.stderr
    assert not (workspace / "amd" / "root" / "te" / "metrics.jsonl").exists()
