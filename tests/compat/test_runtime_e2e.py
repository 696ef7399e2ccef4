"""AMD Primus keys in a real run (TorchTitan, tiny, CPU): each said once per rank, kernels named, averages; an
AMD Primus-format file trains on AMD Primus's mock tokens, as it does there."""

import pytest

from tests.conftest import ROOT, TINY_EXAMPLE
from tests.helpers import read_metrics

AMD_QWEN3 = ROOT / "tests" / "fixtures" / "amd_primus" / "examples" / "torchtitan" / "configs" / "MI300X" / \
    "qwen3_8B-pretrain.yaml"

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


def test_an_amd_format_file_trains_on_amd_primus_mock_tokens(run_primus, workspace, tiny_cache):
    """AMD's Qwen3 8B file names no data: AMD Primus trains it on its mock tokens (its pre_trainer.yaml's
    ``mock_data: true``), so here too. Shrunk on the command line (the tiny model and tokenizer; compile off
    to keep the CPU run short)."""
    pytest.importorskip("torchtitan")
    from primus.data.tiny_assets import ensure_tiny_assets

    tokenizer = ensure_tiny_assets(tiny_cache / "tiny_llm")["tokenizer"]
    result = run_primus("train", AMD_QWEN3, f"workspace={workspace}", "exp_name=amd-mock",
                        "modules.pre_trainer.model=llama3_tiny.yaml", f"hf_assets_path={tokenizer}",
                        "training.steps=2", "training.local_batch_size=2", "training.seq_len=64",
                        "compile.enable=false")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = workspace / "amd" / "root" / "amd-mock"
    params = yaml_load(run_dir / "config.resolved.yaml")["modules"]["pre_trainer"]["params"]
    assert params["dataloader"] == {"dataset": "mock"} and params["optimizer"]["lr"] == 8e-4
    assert "Preparing mock dataset" in (run_dir / "logs" / "pre_trainer" / "rank-0" / "info.log").read_text()
    assert len(read_metrics(run_dir)) == 2
