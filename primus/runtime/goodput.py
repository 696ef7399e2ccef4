"""How much of a run's wall time trained the model: ``goodput = productive / total``.

``total`` is the wall time of every attempt of the run (each ``primus train`` launch, from its
process start to its end; the time between launches is not the job's). It splits into:

- **productive**: the step time of every step whose result the run kept (its last occurrence);
- **lost work**: steps computed again after a restart or a resume (their earlier occurrences);
- **start-up**: from an attempt's start to its first step (validation, spawn, imports, model
  build, checkpoint load);
- **restarts**: from the last step before a torchelastic restart to the first step after it
  (failure detection, tear-down, spawn, checkpoint load);
- **checkpoint** and **evaluation**: rank 0's time in saves and evaluations (measured by the
  step hooks, ``primus.runtime.phases``; a save's stall, not an asynchronous write);
- **other**: the rest (between steps: logging, garbage collection; the end of an attempt).

Inputs are the run's records: the manifest's attempts (``wall_start``/``wall_end``, restarts with
``time_unix``) and metrics.jsonl — step rows (``time`` = end of the step, ``step_time``) and each
worker group's ``worker`` event (its checkpoint and evaluation seconds).
"""
from __future__ import annotations

from typing import Any

from primus.runtime.metrics import is_step_row

PARTS = ("productive", "startup", "checkpoint", "eval", "restarts", "lost", "other")
LABELS = {"productive": "productive", "startup": "start-up", "checkpoint": "checkpoint", "eval": "evaluation",
          "restarts": "restarts", "lost": "lost work", "other": "other"}


def account(attempts: list[dict[str, Any]], rows: list[dict[str, Any]], now: float) -> dict[str, Any]:
    """The run's wall time split into ``PARTS`` (seconds), and ``goodput``."""
    spans = [(a["wall_start"], a.get("wall_end") or now, sorted(r["time_unix"] for r in a.get("restarts", [])
                                                                if "time_unix" in r))
             for a in attempts if "wall_start" in a]
    steps = [r for r in rows if is_step_row(r) and "time" in r]
    parts = dict.fromkeys(PARTS, 0.0)
    kept: set[int] = set()
    for row in reversed(steps):  # the last occurrence of a step is the one the run kept
        parts["productive" if row["step"] not in kept else "lost"] += row["step_time"]
        kept.add(row["step"])
    for worker in (r for r in rows if r.get("event") == "worker"):
        parts["checkpoint"] += worker.get("checkpoint_s", 0.0)
        parts["eval"] += worker.get("eval_s", 0.0)
    for start, end, restarts in spans:
        inside = sorted((r for r in steps if start <= r["time"] <= end), key=lambda r: r["time"])
        progress, segment = start, 0  # the last step's end; which worker group runs
        for row in inside:
            began = row["time"] - row["step_time"]
            group = sum(1 for t in restarts if t <= began)
            if group != segment:  # the first step after a restart: the time since the last step went to it
                parts["restarts"] += max(0.0, began - progress)
                segment = group
            elif progress == start:
                parts["startup"] += max(0.0, began - start)
            progress = row["time"]
        if not inside:  # no step at all: the attempt never got past its start
            parts["startup"] += end - start
    total = sum(end - start for start, end, _ in spans)
    parts["other"] = total - sum(parts[p] for p in PARTS if p != "other")
    return {"event": "goodput", "total_s": round(total, 3), **{f"{p}_s": round(parts[p], 3) for p in PARTS},
            "goodput": round(parts["productive"] / total, 4) if total > 0 else None}


def line(summary: dict[str, Any]) -> str:
    """``goodput: 81.2% (productive 40.1 s of 49.4 s; start-up 6.3 s, checkpoint 1.2 s, …)``."""
    if summary["goodput"] is None:
        return "goodput: n/a (no attempt with a recorded wall time)"
    rest = ", ".join(f"{LABELS[p]} {summary[f'{p}_s']:.1f} s" for p in PARTS[1:])
    return (f"goodput: {100 * summary['goodput']:.1f}% (productive {summary['productive_s']:.1f} s of "
            f"{summary['total_s']:.1f} s; {rest})")
