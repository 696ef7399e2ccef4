"""AMD Primus keys in a real run (TorchTitan, tiny, CPU): each said once per rank, kernels named, averages."""

import pytest

from tests.conftest import TINY_EXAMPLE
from tests.helpers import read_metrics

pytestmark = [pytest.mark.e2e]


def test_amd_keys_in_a_real_run(run_primus, workspace):
    pytest.importorskip("torchtitan")
    result = run_primus("train", TINY_EXAMPLE, "exp_name=amd-keys", "training.steps=4", "checkpoint.enable=false",
                        "stderr_sink_level=WARNING", "primus_turbo.enable_primus_turbo=true",
                        "optimizer.beta2=0.99", "primus.avg_skip_steps=1", "primus.avg_window=2")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = workspace / "amd" / "root" / "amd-keys"
    info = (run_dir / "logs" / "pre_trainer" / "rank-0" / "info.log").read_text()
    assert info.count("translated primus_turbo.enable_primus_turbo=true → stock kernel here (") == 1
    assert "derived primus_turbo.enable_primus_turbo=stock kernel (Primus-Turbo not installed)" in info
    assert "translated optimizer.beta2=0.99 → optimizer.betas=[0.9, 0.99] (TorchTitan 0.2 name" in info
    assert "[TRAIN]" not in result.stdout  # stderr_sink_level=WARNING: the console shows warnings only
    rows = read_metrics(run_dir)
    assert "avg_step_time" not in rows[0]["extra"]  # step 1 is left out of the averages
    assert rows[1]["extra"]["avg_step_time"] == pytest.approx(rows[1]["step_time"])
    assert rows[2]["extra"]["avg_step_time"] == pytest.approx((rows[1]["step_time"] + rows[2]["step_time"]) / 2)
    assert rows[3]["extra"]["avg_step_time"] == pytest.approx(rows[3]["step_time"])  # a new window of 2
    saved = yaml_load(run_dir / "config.resolved.yaml")
    assert saved["logging"]["level"] == "WARNING"
    assert [t["from"] for t in saved["modules"]["pre_trainer"]["translated"]] == [
        "stderr_sink_level", "optimizer.beta2", "primus_turbo.enable_primus_turbo"]


def yaml_load(path):
    import yaml

    return yaml.safe_load(path.read_text())
