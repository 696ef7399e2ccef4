"""Checkpoints that do not stall training: the step after a save, asynchronous vs synchronous saves.

Each case runs the same experiment with a save every ``interval`` steps, synchronously (A) and
asynchronously (B: Megatron-LM's ``async_save``, TorchTitan's ``checkpoint.async_mode: async``),
interleaved ABBA. The probe records when each optimizer step ends, so the interval between the ends
of steps s and s+1, s a save step, is the save's stall plus step s+1 (which overlaps the background
write). The row reports that interval over the median of the other steps' (3 .. steps, the steps
right after a save left out): for the synchronous save it is the stall, for the asynchronous one the
cost of overlapping (target: <= 1.2x a normal step). Both runs are one rank at torch's default threads.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import PRIMUS, REPO, fmt, md_table, median, run_probed

TINY_TT = REPO / "examples" / "torchtitan" / "llama3_tiny-pretrain.yaml"
TINY_MG = REPO / "examples" / "megatron" / "llama3_tiny-pretrain.yaml"
TARGET = 1.2


def _cases(steps: int, interval: int) -> dict[str, dict[str, Any]]:
    def primus(exp: Path, steps_key: str, sync: list[str], extra_async: list[str], more: list[str]):
        def build(flags: list[str]):
            return lambda ws, i: [PRIMUS, "train", str(exp), f"workspace={ws}", f"exp_name=run{i}",
                                  f"{steps_key}={steps}", *more, *flags]
        return {"sync": build(sync), "async": build(sync + extra_async)}

    return {
        "megatron tiny demo (async_save)": primus(
            TINY_MG, "train_iters", [f"save_interval={interval}"], ["async_save=true"],
            ["eval_interval=100000", "eval_iters=0"]),
        "torchtitan tiny demo (checkpoint.async_mode: async)": primus(
            TINY_TT, "training.steps", ["checkpoint.enable=true", f"checkpoint.interval={interval}"],
            ["checkpoint.async_mode=async"], []),
    }


def _ratios(run, steps: int, interval: int) -> dict[str, Any]:
    after = [s + 1 for s in range(interval, steps, interval)]  # the step after each save (not the last step's)
    normal = median([t for s in range(3, steps + 1) if s not in after and (t := run.step_time(s)) is not None])
    overlapped = median([t for s in after if (t := run.step_time(s)) is not None])
    return {"normal_step_s": normal, "step_after_save_s": overlapped,
            "ratio": overlapped / normal if normal and overlapped else None}


def measure(name: str, case: dict[str, Any], *, reps: int, steps: int, interval: int) -> dict[str, Any]:
    ws = Path(tempfile.mkdtemp(prefix="primus-bench-async-ckpt-"))
    order = [v for r in range(reps) for v in (("sync", "async") if r % 2 == 0 else ("async", "sync"))]  # ABBA
    runs: dict[str, list[dict[str, Any]]] = {"sync": [], "async": []}
    try:
        for i, variant in enumerate(order):
            run = run_probed(f"{name}:{variant}#{i}", case[variant](ws, i), verbose=True)
            if run.rc == 0 and len(run.step_ends) >= steps:
                runs[variant].append(_ratios(run, steps, interval))
    finally:
        shutil.rmtree(ws, ignore_errors=True)
    out: dict[str, Any] = {"case": name, "steps": steps, "interval": interval, "reps": reps}
    for variant, rows in runs.items():
        out[variant] = {key: median([r[key] for r in rows if r[key] is not None])
                        for key in ("normal_step_s", "step_after_save_s", "ratio")}
        out[variant]["runs"] = rows
    ratio = out["async"]["ratio"]
    out["target_met"] = ratio is not None and ratio <= TARGET
    return out


def run(quick: bool) -> dict[str, Any]:
    steps, interval = (12, 4) if quick else (21, 5)
    cases = _cases(steps, interval)
    return {"target": TARGET, "cases": [measure(n, c, reps=1 if quick else 2, steps=steps, interval=interval)
                                        for n, c in cases.items()]}


def markdown(results: dict[str, Any]) -> str:
    rows = []
    for c in results["cases"]:
        sync, asynchronous = c["sync"], c["async"]
        rows.append([c["case"], fmt(sync["normal_step_s"], ".4f"), fmt(sync["step_after_save_s"], ".4f"),
                     f"{fmt(sync['ratio'], '.2f')}x", fmt(asynchronous["normal_step_s"], ".4f"),
                     fmt(asynchronous["step_after_save_s"], ".4f"), f"**{fmt(asynchronous['ratio'], '.2f')}x**",
                     "yes" if c["target_met"] else "no", f"every {c['interval']} of {c['steps']}"])
    return (md_table(["case", "sync: normal step (s)", "sync: step after a save (s)", "sync stall",
                      "async: normal step (s)", "async: step after a save (s)", "async overlapped step",
                      f"≤{results['target']}x", "saves"], rows)
            + "\n\nThe step after a save, timed from the end of the save step (so it holds a synchronous save's "
              "stall), over the median of the other steps; medians over the interleaved runs.")
