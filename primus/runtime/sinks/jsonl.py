"""metrics.jsonl: one JSON object per step, flushed, the run's record of truth."""
from __future__ import annotations

import json
from pathlib import Path

from primus.runtime.metrics import StepMetrics
from primus.runtime.sinks import MetricSink


class JsonlSink(MetricSink):
    def __init__(self, path: Path):
        self.path = path
        self._file = path.open("a", encoding="utf-8")

    def write(self, metrics: StepMetrics) -> None:
        self._file.write(json.dumps(vars(metrics)) + "\n")  # flat fields: no deep-copying asdict()
        self._file.flush()

    def close(self, status: str = "completed") -> None:
        self._file.close()
