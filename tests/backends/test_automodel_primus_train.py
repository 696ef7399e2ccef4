"""NeMo AutoModel through `primus train` itself: the tiny Wan 2.2 demo on 2 ranks (FSDP2, gloo)."""

import pytest

from tests.conftest import ROOT, assert_seed_train_lines
from tests.helpers import read_events, read_metrics

pytestmark = [pytest.mark.e2e]
AUTOMODEL = ROOT / "examples" / "nemo_automodel" / "wan2_2_tiny-cpu.yaml"


def test_tiny_wan_on_two_ranks(run_primus, workspace):
    pytest.importorskip("nemo_automodel")
    result = run_primus("train", AUTOMODEL, "--nproc-per-node", "2", "exp_name=wan2", "step_scheduler.max_steps=2")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = workspace / "amd" / "root" / "wan2"
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["samples_per_sec"] == pytest.approx(2 * rows[0]["samples_per_sec_per_gpu"])
    assert result.stdout.count("[TRAIN] step=1 ") == 1  # Primus' line once; AutoModel's own is dropped
    assert_seed_train_lines(result.stdout, [1, 2])  # the seed PR's regex
    console = result.stdout + result.stderr  # AutoModel's own print, tqdm bar and diffusers' warning: the logs
    for noise in ("initializing torch distributed", "Epoch 1/", "There are modules in WanTransformer3DModel"):
        assert noise not in console, noise
    debug = (run_dir / "logs" / "pre_trainer" / "rank-0" / "debug.log").read_text()
    assert "engine.output: > initializing torch distributed" in debug and "engine.output: Epoch 1/" in debug
    assert {p.name for p in (run_dir / "logs" / "pre_trainer").iterdir()} == {"rank-0", "rank-1"}
    info = (run_dir / "logs" / "pre_trainer" / "rank-0" / "info.log").read_text()
    assert "trains expert 'transformer'" in info and "sigma in [" in info
    [goodput] = read_events(run_dir, "goodput")  # every run ends with its goodput
    assert 0 < goodput["goodput"] < 1 and f"[primus] goodput: {100 * goodput['goodput']:.1f}% " in result.stdout
