"""AMD's SFT examples name the model and the data by Hub id (``hf_path: NousResearch/Meta-Llama-3-8B``,
``sft_dataset_name: tatsu-lab/alpaca``): validate, plan and dry-run download nothing; the run fetches
both once, with HF_TOKEN, from a real HTTP server standing in for the Hub (HF_ENDPOINT), and trains.
"""
from __future__ import annotations

import io
import os

import pytest
import yaml

from tests.compat.hub_server import HubServer
from tests.helpers import cli_in_process, losses, run_dir_of

pytestmark = [pytest.mark.e2e]
MODEL, DATA, TOKEN = "acme/Tiny-Llama-SFT", "acme/tiny-alpaca", "hf_sft_secret_token"


def _parquet(rows) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out.getvalue()


def _experiment(path, hf_dir):
    from primus.hf.config import model_spec_from_hf, read_config

    shape = model_spec_from_hf(read_config(hf_dir), "config.json").model_dump(exclude_none=True)
    path.write_text(yaml.safe_dump({
        "work_group": "amd", "user_name": "root", "exp_name": "sft-hub", "workspace": "${PRIMUS_WORKSPACE:./output}",
        "modules": {"post_trainer": {"framework": "megatron", "config": "sft_trainer.yaml", "overrides": {
            "stage": "sft", "model": shape, "hf_path": MODEL, "sft_dataset_name": DATA,
            "sft_conversation_format": "alpaca", "train_iters": 12, "micro_batch_size": 4, "global_batch_size": 8,
            "seq_length": 128, "lr": 3.0e-3, "min_lr": 3.0e-4, "lr_warmup_iters": 1, "weight_decay": 0.0,
            "bf16": False, "use_distributed_optimizer": False, "eval_interval": 6, "eval_iters": 1,
            "save_interval": 1000, "log_interval": 1}}}}))


def test_hub_model_and_dataset_are_fetched_once_when_the_run_starts(hf_models, run_primus, workspace, tmp_path):
    pytest.importorskip("transformers")
    hf_dir = hf_models("llama")
    model_files = {f.name: f.read_bytes() for f in hf_dir.iterdir() if f.is_file() and not f.name.startswith(".")}
    from primus.data.sft_tiny import tiny_instructions

    rows = [{"instruction": q, "input": "", "output": a} for q, a in tiny_instructions(400, 0)]
    data_files = {"data/train-00000-of-00001.parquet": _parquet(rows[:360]),
                  "data/validation-00000-of-00001.parquet": _parquet(rows[360:]), "README.md": b"# tiny alpaca\n"}
    experiment = tmp_path / "sft-hub.yaml"
    _experiment(experiment, hf_dir)
    with HubServer(MODEL, model_files, TOKEN, more={("dataset", DATA): data_files}) as hub:
        env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": TOKEN,
               "HF_HUB_DISABLE_TELEMETRY": "1"}
        for argv in (["config", "validate", experiment], ["plan", experiment],
                     ["train", experiment, "--dry-run"]):
            checked = cli_in_process(*argv, env={**os.environ, "PRIMUS_WORKSPACE": str(workspace), **env})
            assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]
        assert hub.requests == []  # nothing downloaded before the run
        result = run_primus("train", experiment, env=env, timeout=600)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        fetched = {line.split(" ", 1)[1] for line in hub.requests if line.startswith("GET") and "/resolve/" in line}
    assert any(p.startswith("/datasets/acme/tiny-alpaca/resolve/") for p in fetched)
    assert any("model.safetensors" in p for p in fetched) and not any("README" in p for p in fetched)
    run_dir = run_dir_of(workspace, "sft-hub")
    info = (run_dir / "logs" / "post_trainer" / "rank-0" / "info.log").read_text()
    assert f"Hugging Face Hub '{DATA}', fetched once" in info and f"Hugging Face Hub '{MODEL}', fetched once" in info
    assert "SFT train: 360 conversations" in info and "SFT valid: 40 conversations" in info
    curve = losses(run_dir)
    assert len(curve) == 12 and min(curve[-3:]) < 0.7 * curve[0], curve
    assert TOKEN not in "".join(p.read_text(errors="replace") for p in run_dir.rglob("*") if p.is_file()
                                and p.suffix in (".log", ".yaml", ".json", ".jsonl"))


def _model_files(hf_dir):
    return {f.name: f.read_bytes() for f in hf_dir.iterdir() if f.is_file() and not f.name.startswith(".")}


def _hub_env(hub, tmp_path):
    return {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": TOKEN,
            "HF_HUB_DISABLE_TELEMETRY": "1"}


def _without_model(path, instructions):
    """A Megatron SFT whose network is only the Hub model's config.json (no model preset)."""
    path.write_text(yaml.safe_dump({
        "work_group": "amd", "user_name": "root", "exp_name": "sft-hub-nomodel",
        "workspace": "${PRIMUS_WORKSPACE:./output}",
        "modules": {"pre_trainer": {"framework": "megatron", "config": "pre_trainer.yaml", "stage": "sft",
                                    "overrides": {
            "hf_path": MODEL, "sft_dataset_name": str(instructions), "train_iters": 3, "micro_batch_size": 4,
            "global_batch_size": 8, "seq_length": 128, "bf16": False, "use_distributed_optimizer": False,
            "eval_interval": 1000, "save_interval": 1000}}}}))
    return path


def test_a_hub_model_without_a_model_preset_validates_and_is_fetched_when_the_run_starts(
        hf_models, instructions, run_primus, workspace, tmp_path):
    experiment = _without_model(tmp_path / "exp.yaml", instructions["messages"])
    with HubServer(MODEL, _model_files(hf_models("llama")), TOKEN) as hub:
        env = _hub_env(hub, tmp_path)
        for argv in (["config", "validate", experiment], ["train", experiment, "--dry-run"]):
            checked = cli_in_process(*argv, env={**os.environ, "PRIMUS_WORKSPACE": str(workspace), **env})
            assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]
        assert hub.requests == []
        result = run_primus("train", experiment, env=env, timeout=600)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    info = (run_dir_of(workspace, "sft-hub-nomodel") / "logs" / "pre_trainer" / "rank-0" / "info.log").read_text()
    assert f"Hugging Face Hub '{MODEL}', fetched once" in info and "derived model=llama3 2x128 (from " in info
    assert len(losses(run_dir_of(workspace, "sft-hub-nomodel"))) == 3


@pytest.mark.parametrize("mode", ["silent", "404"])
def test_a_hub_in_trouble_ends_the_run_before_any_rank_starts_with_one_line(mode, hf_models, instructions,
                                                                            run_primus, workspace, tmp_path):
    """2 ranks; a Hub that accepts connections and never answers (bounded by primus.hub timeouts:
    here 5 s to connect or read, 15 s without an answer), or answers 404: exit 2 and one line before any
    rank starts (the launcher's prepare fetches), no traceback."""
    import time

    experiment = _without_model(tmp_path / "exp.yaml", instructions["messages"])
    timeouts = ["primus.hub.connect_timeout_s=5", "primus.hub.read_timeout_s=5", "primus.hub.stall_timeout_s=15"]
    with HubServer(MODEL, _model_files(hf_models("llama")), TOKEN, mode=mode) as hub:
        started = time.monotonic()
        result = run_primus("train", experiment, "--nproc-per-node", "2", *timeouts, env=_hub_env(hub, tmp_path),
                            timeout=600)
        took = time.monotonic() - started
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stdout + result.stderr
    # the node's launcher fetches the Hub model in prepare, before any rank starts: one line, from it
    errors = [line for line in (result.stdout + result.stderr).splitlines()
              if f"hf_path: cannot fetch the model '{MODEL}'" in line]
    assert len(errors) == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert ("no answer from" if mode == "silent" else "RepositoryNotFoundError") in errors[0]
    assert not (run_dir_of(workspace, "sft-hub-nomodel") / "logs" / "pre_trainer" / "rank-1").exists()
    assert took < 300  # a hang guard: the fetch gives up after 15 s without an answer
