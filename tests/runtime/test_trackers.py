"""Experiment trackers for real: W&B in offline mode and MLflow on a local file store, read back
with their own formats/clients; settings from Megatron-LM / AMD Primus keys and logging blocks."""
import json
import logging
import math
from pathlib import Path

import pytest
import yaml

from primus.runtime.metrics import EvalReport, StepReport
from primus.runtime.reporter import MetricsReporter
from primus.runtime.sinks.trackers import mlflow_settings, tracker_sinks, wandb_settings
from tests.helpers import ROOT
from tests.runtime.trackers_readback import mlflow_run, wandb_offline_run

SECRET = "hf_supersecretvalue123"


def _tree(logging_block=None, **params):
    return {"work_group": "amd", "user_name": "root", "exp_name": "exp1", "workspace": "/ws",
            "logging": {"console_ranks": [0], "level": "INFO", **(logging_block or {})},
            "modules": {"pre_trainer": {"framework": "megatron", "stage": "pretrain",
                                        "params": {"lr": 1e-3, "primus": {"hf_token": SECRET}, **params}}}}


def test_megatron_lm_and_amd_keys_turn_trackers_on(tmp_path):
    tree = _tree(wandb_project="Primus_Pretrain", wandb_save_dir="/w", wandb_entity="team")
    params = tree["modules"]["pre_trainer"]["params"]
    w = wandb_settings(tree, params, tmp_path)
    assert (w.project, w.name, w.dir, w.entity) == ("Primus_Pretrain", "exp1", Path("/w"), "team")  # name: exp_name
    assert wandb_settings(tree, {**params, "disable_wandb": True}, tmp_path) is None  # AMD Primus' switch
    assert wandb_settings(_tree(wandb_project=None), {"wandb_project": None}, tmp_path) is None  # AMD default: null
    assert mlflow_settings(tree, params, tmp_path, env={}) is None  # not asked for
    m = mlflow_settings(tree, {"mlflow_run_name": "r1"}, tmp_path, env={})
    assert (m.run_name, m.experiment_name, m.tracking_uri) == ("r1", "amd/root", (tmp_path / "mlruns").as_uri())
    assert mlflow_settings(tree, {"mlflow_run_name": "r1", "disable_mlflow": True}, tmp_path, env={}) is None
    assert mlflow_settings(tree, {"disable_mlflow": False}, tmp_path, env={"MLFLOW_TRACKING_URI": "http://x"}) \
        .tracking_uri == "http://x"


def test_the_logging_block_wins_key_by_key_on_every_backend(tmp_path):
    tree = _tree({"wandb": {"project": "mine", "mode": "offline", "tags": ["a"]},
                  "mlflow": {"experiment_name": "e", "tracking_uri": "file:/t"}},
                 wandb_project="theirs", wandb_exp_name="n2", mlflow_run_name="r")
    params = tree["modules"]["pre_trainer"]["params"]
    w = wandb_settings(tree, params, tmp_path)
    assert (w.project, w.name, w.mode, w.tags, w.dir) == ("mine", "n2", "offline", ["a"], tmp_path / "wandb")
    m = mlflow_settings(tree, params, tmp_path, env={"MLFLOW_TRACKING_URI": "http://ignored"})
    assert (m.experiment_name, m.run_name, m.tracking_uri) == ("e", "r", "file:/t")
    assert wandb_settings(_tree({"wandb": {"project": "p", "mode": "disabled"}}), {}, tmp_path) is None


def _report_steps(tmp_path, tree, status="completed"):
    sinks = tracker_sinks(tree, "pre_trainer", tmp_path, rank=0)
    reporter = MetricsReporter(tmp_path, rank=0, world_size=2, device="cpu", peak_tflops=None,
                               enable_tensorboard=False, extra_sinks=sinks)
    for step in (1, 2, 3):
        reporter.report(StepReport(step=step, loss=4.0 - step, step_time_s=0.5, samples=4, tokens=512, flops=1e12,
                                   lr=1e-3, extra={"load_balancing_loss": 0.01 * step}))
        if step == 2:
            reporter.report_eval(EvalReport(step=2, loss=1.5))  # a validation pass after step 2
    reporter.close(status)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return sinks, {r["step"]: r for r in rows if r.get("kind") != "eval"}


def _same_numbers(history, jsonl_rows):
    """Every metrics.jsonl number under its name at its step; the validation pass as eval/loss, eval/ppl."""
    assert sorted(history) == sorted(jsonl_rows)
    for step, row in jsonl_rows.items():
        expected = {k: v for k, v in row.items() if k not in ("step", "extra", "time") and v is not None}
        expected.update(row["extra"])
        if step == 2:
            expected.update({"eval/loss": 1.5, "eval/ppl": math.exp(1.5)})
        assert history[step] == pytest.approx(expected), step


def test_wandb_offline_run_holds_the_jsonl_numbers_and_the_redacted_config(tmp_path):
    pytest.importorskip("wandb")
    tree = _tree({"wandb": {"mode": "offline"}}, wandb_project="Primus_Pretrain")
    sinks, rows = _report_steps(tmp_path, tree)
    assert [type(s).__name__ for s in sinks] == ["WandbSink"]
    run = wandb_offline_run(tmp_path / "wandb")
    assert (run["project"], run["name"], run["exit_code"]) == ("Primus_Pretrain", "exp1", 0)
    _same_numbers(run["history"], rows)
    assert run["history"][3]["load_balancing_loss"] == pytest.approx(0.03)  # StepReport.extra scalars too
    params = run["config"]["modules"]["pre_trainer"]["params"]
    assert params["lr"] == 1e-3 and params["primus"]["hf_token"] == "<redacted>"
    leaked = [p for p in (tmp_path / "wandb").rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not leaked


def test_mlflow_file_store_run_holds_the_jsonl_numbers_params_and_config(tmp_path):
    pytest.importorskip("mlflow")
    tree = _tree(mlflow_run_name="r1", mlflow_experiment_name="Primus_Exp")
    sinks, rows = _report_steps(tmp_path, tree, status="failed")
    assert [type(s).__name__ for s in sinks] == ["MlflowSink"]
    run = mlflow_run((tmp_path / "mlruns").as_uri(), "Primus_Exp")
    assert (run["name"], run["status"]) == ("r1", "FAILED")  # how the run ended, not always FINISHED
    _same_numbers(run["history"], rows)
    assert run["params"]["modules.pre_trainer.params.lr"] == "0.001"
    assert run["params"]["modules.pre_trainer.params.primus.hf_token"] == "<redacted>"
    config = yaml.safe_load(run["config_artifact"])
    assert config["modules"]["pre_trainer"]["params"]["primus"]["hf_token"] == "<redacted>"
    assert not [p for p in (tmp_path / "mlruns").rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]


def test_a_tracker_that_cannot_start_is_a_warning_not_a_failed_run(tmp_path, monkeypatch, caplog):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: W&B online has no credentials
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "cfg"))
    tree = _tree({"wandb": {"project": "p", "mode": "online"}, "mlflow": {"tracking_uri": "nosuchscheme://x"}})
    with caplog.at_level(logging.WARNING, logger="primus.metrics"):
        sinks, rows = _report_steps(tmp_path, tree)
    assert sinks == [] and sorted(rows) == [1, 2, 3]  # metrics.jsonl still complete
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(w.startswith("W&B not started") and "training continues" in w for w in warnings), warnings
    assert any(w.startswith("MLflow not started") for w in warnings), warnings


def test_other_ranks_start_no_tracker(tmp_path):
    tree = _tree({"wandb": {"project": "p", "mode": "offline"}, "mlflow": {}})
    assert tracker_sinks(tree, "pre_trainer", tmp_path, rank=1) == []
    assert not (tmp_path / "wandb").exists() and not (tmp_path / "mlruns").exists()


def test_a_tracker_that_breaks_mid_run_is_dropped_with_one_warning(tmp_path, caplog):
    from primus.runtime.sinks.trackers import TrackerSink

    class Flaky(TrackerSink):
        label, calls = "Flaky", 0

        def log(self, step, scalars):
            self.calls += 1
            raise ConnectionError("server went away")

        def finish(self, status):
            pass

    flaky = Flaky()
    with caplog.at_level(logging.WARNING, logger="primus.metrics"):
        reporter = MetricsReporter(tmp_path, rank=0, world_size=1, device="cpu", peak_tflops=None,
                                   enable_tensorboard=False, extra_sinks=[flaky])
        for step in (1, 2):
            reporter.report(StepReport(step=step, loss=1.0, step_time_s=0.1, samples=1))
        reporter.close()
    assert flaky.calls == 1 and len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
    assert [r.getMessage() for r in caplog.records] == ["Flaky stopped logging: ConnectionError: server went away; "
                                                        "training continues"]


def test_amd_primus_tracker_switches_arrive_through_the_compat_layer(tmp_path):
    """AMD's `disable_wandb: true` beside `wandb_project` keeps W&B off (compat turns it into
    primus.wandb=false); `mlflow_run_name` turns MLflow on with that name."""
    from primus.compat import AMD_PRIMUS
    from primus.config.resolve import resolve_experiment
    from primus.runtime.registry import backend_defaults

    exp = tmp_path / "exp.yaml"
    exp.write_text((ROOT / "examples" / "megatron" / "llama3_tiny-pretrain.yaml").read_text())
    resolved = resolve_experiment(exp, ["wandb_project=p", "disable_wandb=true", "mlflow_run_name=r9"],
                                  backend_defaults, dialect=AMD_PRIMUS)
    params = resolved.modules["pre_trainer"].params
    assert wandb_settings(resolved.tree(), params, tmp_path) is None
    assert mlflow_settings(resolved.tree(), params, tmp_path, env={}).run_name == "r9"
    resolved = resolve_experiment(exp, ["wandb_project=p"], backend_defaults, dialect=AMD_PRIMUS)
    assert wandb_settings(resolved.tree(), resolved.modules["pre_trainer"].params, tmp_path).project == "p"
