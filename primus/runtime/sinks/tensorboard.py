"""TensorBoard event files under ``{run_dir}/tensorboard`` (skipped, with a note, if not installed)."""
from __future__ import annotations

import logging
from pathlib import Path

from primus.runtime.metrics import EvalMetrics, StepMetrics
from primus.runtime.sinks import MetricSink

logger = logging.getLogger("primus.metrics")


class TensorBoardSink(MetricSink):
    """The step's scalars as ONE TensorBoard event (a Summary with several values, as TensorBoard
    itself writes them): a third of the cost of one ``add_scalar`` call per tag."""

    def __init__(self, writer, summary_cls):
        self.writer, self.summary_cls = writer, summary_cls

    def write(self, metrics: StepMetrics) -> None:
        self._add({f"train/{key}": value for key, value in metrics.scalars().items()}, metrics.step)

    def write_eval(self, metrics: EvalMetrics) -> None:
        self._add(metrics.scalars(), metrics.step)  # eval/loss, eval/ppl

    def _add(self, scalars: dict[str, float], step: int) -> None:
        values = [self.summary_cls.Value(tag=tag, simple_value=value) for tag, value in scalars.items()]
        self.writer.file_writer.add_summary(self.summary_cls(value=values), step)

    def close(self, status: str = "completed") -> None:
        self.writer.close()


def tensorboard_sink(path: Path) -> TensorBoardSink | None:
    try:
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        logger.info("TensorBoard not installed: skipping event files (pip install tensorboard)")
        return None
    return TensorBoardSink(SummaryWriter(str(path)), Summary)
