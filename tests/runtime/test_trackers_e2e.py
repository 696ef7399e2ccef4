"""W&B (offline) and MLflow (file store) through `primus train`: the run's metrics.jsonl rows
and its resolved config reach both trackers, read back with their own formats and client."""

import pytest

from tests.conftest import TINY_EXAMPLE
from tests.runtime.trackers_readback import mlflow_run, wandb_offline_run
from tests.helpers import read_metrics

pytestmark = [pytest.mark.e2e]


def test_primus_train_logs_to_wandb_offline_and_mlflow(run_primus, workspace):
    pytest.importorskip("torchtitan")
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    result = run_primus("train", TINY_EXAMPLE, "exp_name=tracked", "training.steps=3",
                        "logging.wandb.project=Primus_Pretrain", "logging.wandb.mode=offline",
                        "logging.mlflow.experiment_name=Primus_Exp", env={"HF_TOKEN": "hf_never_in_a_tracker"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = workspace / "amd" / "root" / "tracked"
    rows = {r["step"]: r for r in read_metrics(run_dir)}
    assert sorted(rows) == [1, 2, 3]
    expected = {step: {k: v for k, v in row.items() if k not in ("step", "extra", "time") and v is not None}
                for step, row in rows.items()}

    w = wandb_offline_run(run_dir / "wandb")
    assert (w["project"], w["name"], w["exit_code"]) == ("Primus_Pretrain", "tracked", 0)
    assert sorted(w["history"]) == [1, 2, 3]
    assert all(w["history"][step] == pytest.approx(expected[step]) for step in expected)
    assert w["config"]["modules"]["pre_trainer"]["params"]["training"]["steps"] == 3
    assert "wandb sync" in result.stdout  # where the offline run is, and how to upload it

    m = mlflow_run((run_dir / "mlruns").as_uri(), "Primus_Exp")
    assert (m["name"], m["status"]) == ("tracked", "FINISHED")
    assert sorted(m["history"]) == [1, 2, 3]
    assert all(m["history"][step] == pytest.approx(expected[step]) for step in expected)
    assert m["params"]["modules.pre_trainer.params.training.steps"] == "3"
    for folder in (run_dir / "wandb", run_dir / "mlruns"):
        assert not [p for p in folder.rglob("*") if p.is_file() and b"hf_never_in_a_tracker" in p.read_bytes()]


def test_an_amd_primus_megatron_file_with_wandb_project_logs_to_wandb_and_mlflow(run_primus, workspace, tmp_path):
    """Megatron-LM's wandb_* keys, as all of AMD Primus' Megatron experiments set them; W&B offline
    through $WANDB_MODE (Megatron-LM has no mode key), MLflow asked for through logging.mlflow."""
    pytest.importorskip("megatron.core")
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from tests.conftest import ROOT, write

    exp = write(tmp_path / "amd_style.yaml", f"""\
extends: {ROOT / 'examples' / 'megatron' / 'llama3_tiny-pretrain.yaml'}
exp_name: amd_wandb
workspace: {workspace}
logging:
  mlflow: {{experiment_name: Primus_Megatron}}
modules:
  pre_trainer:
    overrides:
      primus: {{tiny_assets: {tmp_path / 'tiny'}}}
      train_iters: 3
      save_interval: 100
      eval_interval: 100
      wandb_project: "Primus_DeepSeek_Pretrain"
      wandb_exp_name: amd_wandb_run
      wandb_save_dir: {tmp_path / 'wandb'}
""")
    result = run_primus("train", exp, env={"WANDB_MODE": "offline"})
    if result.returncode == 2 and "wandb_project: unknown Megatron argument" in result.stderr:
        pytest.skip("the Megatron argument table does not accept Megatron-LM's wandb_* keys yet")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = workspace / "amd" / "root" / "amd_wandb"
    rows = {r["step"]: r for r in read_metrics(run_dir)}
    w = wandb_offline_run(tmp_path / "wandb")
    assert (w["project"], w["name"]) == ("Primus_DeepSeek_Pretrain", "amd_wandb_run")
    assert sorted(w["history"]) == sorted(rows) == [1, 2, 3]
    assert w["history"][3]["loss"] == pytest.approx(rows[3]["loss"])
    m = mlflow_run((run_dir / "mlruns").as_uri(), "Primus_Megatron")
    assert m["name"] == "amd_wandb" and m["history"][3]["loss"] == pytest.approx(rows[3]["loss"])
    assert m["params"]["modules.pre_trainer.params.wandb_project"] == "Primus_DeepSeek_Pretrain"
