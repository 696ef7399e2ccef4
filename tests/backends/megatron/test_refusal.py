"""A setting this host cannot run is refused alike by `config validate`, `train --dry-run` and a real
`train` (admission, before any rank starts): exit 2, one line naming it and why, nothing written."""
from __future__ import annotations

import pytest

from tests.conftest import ROOT
from tests.helpers import cli_in_process

pytest.importorskip("megatron.core")
EXAMPLE = ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml"


@pytest.mark.e2e  # the last refusal is a real `primus train`
@pytest.mark.parametrize("setting, line", [
    (["fp8=e4m3"], "primus: error: command line 'fp8=e4m3': modules.pre_trainer.fp8: 'e4m3' cannot run on a CPU "
                   "host (FP8 training runs in Transformer Engine's layers on a GPU; megatron-core's local layers "
                   "have no FP8)"),
    (["context_parallel_size=2", "--nproc-per-node", "2"],
     "primus: error: command line 'context_parallel_size=2': modules.pre_trainer.context_parallel_size: 2 cannot "
     "run on a CPU host (context parallelism splits attention in Transformer Engine's TEDotProductAttention on a "
     "GPU; megatron-core's local attention refuses it)"),
], ids=["fp8", "context_parallel"])
def test_transformer_engine_settings_are_refused_alike_on_cpu(run_primus, workspace, setting, line):
    from primus.plan.target import host_target

    if host_target().gpu:
        pytest.skip("a GPU host: admission asks its GPU and Transformer Engine")
    for argv in (("config", "validate", EXAMPLE, setting[0]), ("train", EXAMPLE, "--dry-run", *setting)):
        result = cli_in_process(*argv)
        assert (result.returncode, result.stderr.strip().splitlines()) == (2, [line]), result.stderr
    result = run_primus("train", EXAMPLE, "exp_name=te", *setting)
    assert result.returncode == 2
    errors = [text for text in result.stderr.splitlines() if "error" in text.lower() and "Warning" not in text]
    assert errors == [line] and "Traceback" not in result.stderr
    assert not (workspace / "amd" / "root" / "te").exists()
