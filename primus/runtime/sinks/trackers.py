"""Experiment trackers (W&B, MLflow): which to start, from what the user wrote, on rank 0 only.

Two places turn a tracker on, for users coming from either world:
- the Primus-level ``logging.wandb`` / ``logging.mlflow`` blocks (every backend);
- the module's Megatron-LM keys ``wandb_project``, ``wandb_exp_name``, ``wandb_save_dir``,
  ``wandb_entity``, and the ``primus:`` block's ``wandb``/``mlflow`` switches and MLflow names
  (where AMD Primus's ``disable_wandb``, ``disable_mlflow``, ``mlflow_run_name`` and
  ``mlflow_experiment_name`` land, ``primus/compat``).
The Primus-level block wins key by key. A tracker receives the same numbers as metrics.jsonl
and the resolved config with secrets redacted. A tracker that cannot start (not installed,
no credentials, unreachable server) is one warning: the run goes on without it.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from primus.config.secrets import redact_tree
from primus.runtime.sinks import MetricSink

logger = logging.getLogger("primus.metrics")


@dataclass
class WandbSettings:
    project: str
    name: str
    dir: Path
    entity: str | None = None
    mode: str | None = None  # None: wandb decides ($WANDB_MODE, else online)
    tags: list[str] = field(default_factory=list)


@dataclass
class MlflowSettings:
    tracking_uri: str  # logging.mlflow.tracking_uri, else $MLFLOW_TRACKING_URI, else {run_dir}/mlruns
    experiment_name: str
    run_name: str


def _given(value: Any) -> bool:
    return value not in (None, "")


def wandb_settings(tree: dict[str, Any], params: dict[str, Any], run_dir: Path) -> WandbSettings | None:
    block = (tree.get("logging") or {}).get("wandb") or {}
    switch = (params.get("primus") or {}).get("wandb")
    if switch is False or params.get("disable_wandb") is True or block.get("mode") == "disabled":
        return None
    project = block.get("project") or params.get("wandb_project")
    if not _given(project):
        return None
    return WandbSettings(
        project=str(project),
        name=str(block.get("name") or params.get("wandb_exp_name") or tree.get("exp_name") or run_dir.name),
        dir=Path(block.get("dir") or params.get("wandb_save_dir") or run_dir / "wandb"),
        entity=block.get("entity") or params.get("wandb_entity") or None,
        mode=block.get("mode"),
        tags=list(block.get("tags") or []),
    )


def mlflow_settings(tree: dict[str, Any], params: dict[str, Any], run_dir: Path,
                    env: Mapping[str, str] = os.environ) -> MlflowSettings | None:
    block = (tree.get("logging") or {}).get("mlflow")
    primus = params.get("primus") or {}
    names = {key: primus.get(key) or params.get(key) for key in ("mlflow_run_name", "mlflow_experiment_name")}
    if primus.get("mlflow") is False or params.get("disable_mlflow") is True:
        return None
    asked = block is not None or primus.get("mlflow") is True or params.get("disable_mlflow") is False or \
        any(_given(name) for name in names.values())
    if not asked:
        return None
    block = block or {}
    group = "/".join(str(tree[k]) for k in ("work_group", "user_name") if tree.get(k)) or "primus"
    return MlflowSettings(
        tracking_uri=block.get("tracking_uri") or env.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").absolute().as_uri(),
        experiment_name=str(block.get("experiment_name") or names["mlflow_experiment_name"] or group),
        run_name=str(block.get("run_name") or names["mlflow_run_name"] or tree.get("exp_name") or run_dir.name),
    )


def tracker_sinks(tree: dict[str, Any], module_name: str, run_dir: Path, *, rank: int) -> list[MetricSink]:
    """The trackers this run asked for, started; on ranks other than 0, none."""
    if rank != 0:
        return []
    params = ((tree.get("modules") or {}).get(module_name) or {}).get("params") or {}
    config = redact_tree(tree, {})
    sinks: list[MetricSink] = []
    wandb = wandb_settings(tree, params, run_dir)
    if wandb is not None:
        sinks += _start("W&B", "primus.runtime.sinks.wandb_sink", "WandbSink", wandb, config, "wandb")
    mlflow = mlflow_settings(tree, params, run_dir)
    if mlflow is not None:
        sinks += _start("MLflow", "primus.runtime.sinks.mlflow_sink", "MlflowSink", mlflow, config, "mlflow-skinny")
    return sinks


def _start(label: str, module: str, cls: str, settings: Any, config: dict, package: str) -> list[MetricSink]:
    import importlib

    try:
        sink = getattr(importlib.import_module(module), cls).start(settings, config)
    except ImportError as exc:
        logger.warning("%s not started: %s (pip install 'primus[trackers]' or %s); training continues without it",
                       label, exc, package)
        return []
    except Exception as exc:  # a tracker never fails a run: credentials, network, server
        logger.warning("%s not started: %s: %s; training continues without it", label, type(exc).__name__,
                       str(exc).splitlines()[0] if str(exc) else "")
        return []
    logger.info("%s: %s", label, sink.describe())
    return [sink]


class TrackerSink(MetricSink):
    """A tracker's ``write``/``close`` never raise: the first failure is one warning, then the
    tracker is dropped for the rest of the run."""

    label = "tracker"
    failed = False

    def write(self, metrics) -> None:
        if not self.failed:
            self._guard(self.log, metrics.step, metrics.scalars())

    def write_eval(self, metrics) -> None:
        if not self.failed:
            self._guard(self.log, metrics.step, metrics.scalars())  # eval/loss, eval/ppl

    def close(self, status: str = "completed") -> None:
        self._guard(self.finish, status)

    def _guard(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as exc:
            if not self.failed:
                logger.warning("%s stopped logging: %s: %s; training continues", self.label, type(exc).__name__, exc)
            self.failed = True

    def log(self, step: int, scalars: dict[str, float]) -> None:
        """Record ``scalars`` at ``step`` (a training step's numbers, or a validation pass's ``eval/*``)."""
        raise NotImplementedError

    def finish(self, status: str) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        return self.label
