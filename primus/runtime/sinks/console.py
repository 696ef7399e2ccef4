"""The ``[TRAIN]`` line, through the ``primus.metrics`` logger (console and info.log alike)."""
from __future__ import annotations

import logging

from primus.runtime.metrics import StepMetrics, format_train_line
from primus.runtime.sinks import MetricSink

logger = logging.getLogger("primus.metrics")


class ConsoleSink(MetricSink):
    def write(self, metrics: StepMetrics) -> None:
        logger.info(format_train_line(metrics))
