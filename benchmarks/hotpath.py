"""Primus's own per-step cost, measured in isolation (no engine, no noise from the model).

What runs per step on rank 0 in a Primus run and not in the bare engine: the backend's tap
(TorchTitan: a wrapper around ``train_step`` + one around ``metrics_processor.log``) and
``RunContext.report_step`` -> ``MetricsReporter.report``: derive the rates, ``getrusage``,
one JSON line (flushed), one ``[TRAIN]`` log record through Primus's handlers (4 level files +
console), 7 TensorBoard scalars, and the fault-injection check. Printed as JSON (microseconds
per step), broken down so a regression points at its cause.

    python -m benchmarks.hotpath [--n 300]
"""
from __future__ import annotations

import argparse
import io
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _per_call_us(fn, n: int, gap_s: float = 0.002) -> float:
    """Median cost of one call, with ``gap_s`` of idle between calls as in training (a step runs
    between two reports): background writers (TensorBoard's thread) drain in the gap, as they
    would, instead of back-pressuring a tight loop."""
    fn()  # warm
    times = []
    for _ in range(n):
        time.sleep(gap_s)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=300)
    args = p.parse_args(argv)
    from primus.logs.setup import setup_logging
    from primus.runtime.context import RunContext
    from primus.runtime.metrics import StepReport, derive
    from primus.runtime.reporter import MetricsReporter

    tmp = Path(tempfile.mkdtemp(prefix="primus-hotpath-"))
    stdout, sys.stdout = sys.stdout, io.StringIO()  # the console handler writes here, not to the terminal
    try:
        logger = setup_logging(tmp / "logs", "pre_trainer", 0, 1)
        report = StepReport(step=1, loss=2.5, step_time_s=0.5, samples=2, tokens=512, flops=8e10, lr=1e-3,
                            grad_norm=1.0)
        results = {}
        results["derive_us"] = _per_call_us(lambda: derive(report, world_size=1, device="cpu", peak_tflops=None), args.n)
        for name, tb in (("report_no_tb_us", False), ("report_us", True)):
            (tmp / name).mkdir(exist_ok=True)
            reporter = MetricsReporter(tmp / name, rank=0, world_size=1, device="cpu", peak_tflops=None,
                                       enable_tensorboard=tb)
            ctx = RunContext(run_dir=tmp / name, rank=0, local_rank=0, world_size=1, device="cpu", logger=logger,
                             reporter=reporter)
            results[name] = _per_call_us(lambda: ctx.report_step(report), args.n)
            board = next((s for s in reporter.sinks if type(s).__name__ == "TensorBoardSink"), None)
            if tb and board is not None:  # timed on its own: a difference of two medians is noise at ~20 us
                metrics = derive(report, world_size=1, device="cpu", peak_tflops=None)
                results["tensorboard_us"] = _per_call_us(lambda: board.write(metrics), args.n)
            reporter.close()
        results["log_record_us"] = _per_call_us(lambda: logging.getLogger("primus.metrics").info("[TRAIN] x"), args.n)
        results["tensorboard_installed"] = "tensorboard_us" in results
    finally:
        sys.stdout = stdout
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in results.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
