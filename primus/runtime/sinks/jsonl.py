"""metrics.jsonl: one JSON object per step, per validation pass (``"kind": "eval"``) and per
event (``{"event": kind, ...}``), flushed: the run's record of truth."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from primus.runtime.metrics import EvalMetrics, StepMetrics
from primus.runtime.rundir import reopen_if_deleted
from primus.runtime.sinks import MetricSink


class JsonlSink(MetricSink):
    def __init__(self, path: Path):
        self.path = path
        self._file = path.open("a", encoding="utf-8")

    def write(self, metrics: StepMetrics) -> None:
        self._append(metrics.row())

    def write_eval(self, metrics: EvalMetrics) -> None:
        self._append(metrics.row())

    def _append(self, row: dict) -> None:
        self._file = reopen_if_deleted(self._file, self.path, _warn_reopened)
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def event(self, record: dict) -> None:
        self._append(record)

    def close(self, status: str = "completed") -> None:
        self._file.close()


def _warn_reopened(path: Path) -> None:
    logging.getLogger("primus.metrics").warning(
        "%s was deleted during the run: reopened it; the steps before this one are not in it", path)
