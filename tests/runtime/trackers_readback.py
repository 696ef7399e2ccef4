"""Read experiment trackers' local files back the way their own tools do (for the tests)."""
from __future__ import annotations

import json
import struct
from pathlib import Path


def wandb_records(run_file: Path) -> list:
    """The protobuf records of a ``run-*.wandb`` file (LevelDB log format: 32 KiB blocks of
    7-byte-header chunks, FULL=1 / FIRST=2 / MIDDLE=3 / LAST=4). wandb 0.31 reads it in Go only."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", run_file
    pos, block, pending, records = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def wandb_offline_run(wandb_dir: Path) -> dict:
    """project, name, config, history rows (step -> {key: value}) and exit code of the one offline run."""
    files = sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    out = {"history": {}, "config": {}, "exit_code": None}
    for record in wandb_records(files[0]):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["project"], out["name"] = record.run.project, record.run.display_name
            out["config"].update({_key(i): json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            out["config"].update({_key(i): json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            row = {_key(i): json.loads(i.value_json) for i in record.history.item}
            step = row.get("_step", record.history.step.num)
            out["history"].setdefault(step, {}).update({k: v for k, v in row.items() if not k.startswith("_")})
        elif kind == "exit":
            out["exit_code"] = record.exit.exit_code
    return out


def mlflow_run(tracking_uri: str, experiment: str) -> dict:
    """The one run of ``experiment``, read back with MLflow's own client."""
    import os

    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment!r} at {tracking_uri}"
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1, runs
    run = runs[0]
    history = {}
    for key in run.data.metrics:
        for m in client.get_metric_history(run.info.run_id, key):
            history.setdefault(m.step, {})[key] = m.value
    artifact = Path(client.download_artifacts(run.info.run_id, "config.resolved.yaml"))
    return {"name": run.info.run_name, "status": run.info.status, "params": run.data.params, "history": history,
            "config_artifact": artifact.read_text()}
