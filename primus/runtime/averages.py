"""Running averages of a run's step rates, as AMD Primus prints them beside each step."""
from __future__ import annotations

from primus.runtime.metrics import StepMetrics


class StepAverages:
    """Running averages of the step rates, as AMD Primus logs them (``log_avg_skip_iterations`` /
    ``log_avg_reset_interval``): the first ``skip`` steps are left out, and the average restarts
    every ``window`` steps."""

    KEYS = ("step_time", "tflops", "tokens_per_sec")

    def __init__(self, skip: int, window: int):
        self.skip, self.window = skip, window
        self.recent: list[StepMetrics] = []

    def update(self, metrics: StepMetrics) -> dict[str, float]:
        if metrics.step == self.skip + 1 or len(self.recent) >= self.window:
            self.recent.clear()
        if metrics.step > self.skip:
            self.recent.append(metrics)
        averages = {}
        for key in self.KEYS:
            values = [getattr(m, key) for m in self.recent if getattr(m, key) is not None]
            if values:
                averages[f"avg_{key}"] = sum(values) / len(values)
        return averages
