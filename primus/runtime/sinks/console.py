"""The ``[TRAIN]`` and ``[EVAL]`` lines, through the ``primus.metrics`` logger (console and info.log alike)."""
from __future__ import annotations

import logging

from primus.runtime.metrics import EvalMetrics, StepMetrics, format_eval_line, format_train_line
from primus.runtime.sinks import MetricSink

logger = logging.getLogger("primus.metrics")


class ConsoleSink(MetricSink):
    def write(self, metrics: StepMetrics) -> None:
        logger.info(format_train_line(metrics))

    def write_eval(self, metrics: EvalMetrics) -> None:
        logger.info(format_eval_line(metrics))
