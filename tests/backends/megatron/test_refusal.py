"""An argument this backend cannot honour is refused alike by `config validate`, `train --dry-run` and a
real `train` (admission, before any rank starts): exit 2, one line naming it, nothing written."""
from __future__ import annotations

import pytest

from tests.conftest import ROOT
from tests.helpers import cli_in_process

pytest.importorskip("megatron.core")
EXAMPLE = ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml"
LINE = ("primus: error: command line 'fp8=e4m3': modules.pre_trainer.fp8: 'e4m3' cannot be honoured on cpu (FP8 "
        "training through Transformer Engine: not wired to megatron-core's Transformer Engine layers in Primus yet, "
        "on any device); ignoring it would change the run, so training stops (remove it or set it to Megatron-LM's "
        "default, None)")


@pytest.mark.e2e  # the last refusal is a real `primus train`
def test_fp8_is_refused_alike_by_validate_dry_run_and_train(run_primus, workspace, monkeypatch):
    from primus.runtime import admission

    if admission.local_target().gpu:
        pytest.skip("this host has a GPU: the line names it")
    for argv in (("config", "validate", EXAMPLE), ("train", EXAMPLE, "--dry-run")):
        result = cli_in_process(*argv, "fp8=e4m3")
        assert (result.returncode, result.stderr.strip().splitlines()) == (2, [LINE])
    result = run_primus("train", EXAMPLE, "exp_name=fp8", "fp8=e4m3")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower() and "Warning" not in line]
    assert errors == [LINE] and "Traceback" not in result.stderr
    assert not (workspace / "amd" / "root" / "fp8").exists()
