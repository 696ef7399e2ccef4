"""MLflow: one run per training run, the metrics.jsonl numbers at each step, the resolved
config as params and as an artifact.

mlflow is imported here only, when a run asked for it. With no tracking URI anywhere
(``logging.mlflow.tracking_uri``, ``$MLFLOW_TRACKING_URI``) the run is kept in a file store
under ``{run_dir}/mlruns`` (``mlflow ui --backend-store-uri`` that folder).
"""
from __future__ import annotations

import os
from typing import Any

from primus.runtime.rundir import RunDir
from primus.runtime.sinks.trackers import MlflowSettings, TrackerSink

_STATUS = {"completed": "FINISHED", "preempted": "KILLED"}
_PARAM_CHUNK = 100  # MLflow takes at most 100 params per log_batch
_PARAM_VALUE_MAX = 6000  # and values of at most 6000 characters


def flatten(tree: Any, prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``; lists stay one value."""
    if not isinstance(tree, dict):
        return {prefix: str(tree)[:_PARAM_VALUE_MAX]}
    out: dict[str, str] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


class MlflowSink(TrackerSink):
    label = "MLflow"

    def __init__(self, client, run_id: str, settings: MlflowSettings, metric_cls):
        self.client, self.run_id, self.settings, self.metric_cls = client, run_id, settings, metric_cls

    @classmethod
    def start(cls, settings: MlflowSettings, config: dict[str, Any]) -> "MlflowSink":
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        if settings.tracking_uri.startswith("file:") or "://" not in settings.tracking_uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store on request
        client = MlflowClient(tracking_uri=settings.tracking_uri)
        experiment = client.get_experiment_by_name(settings.experiment_name)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(settings.experiment_name)
        run = client.create_run(experiment_id, run_name=settings.run_name)
        params = [Param(key, value) for key, value in flatten(config).items()]
        for i in range(0, len(params), _PARAM_CHUNK):
            client.log_batch(run.info.run_id, params=params[i:i + _PARAM_CHUNK])
        client.log_dict(run.info.run_id, config, RunDir.CONFIG)
        return cls(client, run.info.run_id, settings, Metric)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        import time

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[self.metric_cls(key, value, now, step)
                                                    for key, value in scalars.items()])

    def finish(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=_STATUS.get(status, "FAILED"))

    def describe(self) -> str:
        return f"experiment {self.settings.experiment_name}, run {self.settings.run_name} ({self.run_id}) at {self.settings.tracking_uri}"
