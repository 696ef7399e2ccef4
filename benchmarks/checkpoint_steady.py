"""Steady step time after the first checkpoint vs. the same run with checkpoints off.

Each case runs the same experiment with checkpoints on (A: a save every ``interval`` steps) and
off (B), interleaved ABBA, at torch's default intra-op threads (the effect needs more than one:
see ``primus/backends/dcp_group.py``). The row's ratio compares the median of steps
``interval + 3 .. steps`` (after the first save, the save's own step and one more left out) of A
with the same steps of B. For TorchTitan the bare engine runs too, with Primus's fix left out
(``--without-patch checkpoint_on_transient_group``): the upstream behaviour, same run, same load.

Load-independent evidence next to the timing: the process's thread count at the first and last
step (an OpenMP pool left in a gloo thread by a save is one more thread), and the voluntary
context switches of its non-main threads per steady step (``BENCH_PROBE_WAKEUPS``): on an idle
machine OpenMP workers that spin between parallel regions switch a few times per step, throttled
ones hundreds (under load both are in the hundreds: only the thread count is load-free).
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import CONFIGS, PRIMUS, PY, REPO, TT_ASSETS, fmt, md_table, median, run_probed

TINY_TT = REPO / "examples" / "torchtitan" / "llama3_tiny-pretrain.yaml"
TINY_MG = REPO / "examples" / "megatron" / "llama3_tiny-pretrain.yaml"
TINY_PRESET = REPO / "primus" / "configs" / "models" / "common" / "llama3_tiny.yaml"
PRESET_25M = CONFIGS / "presets" / "llama_25m.yaml"
FIX = "checkpoint_on_transient_group"
TARGET, ACCEPT = 1.02, 1.10


def _cases(steps: int, interval: int) -> dict[str, dict[str, Any]]:
    """name -> {"on"/"off": (ws, i) -> argv, "bare_on"/"bare_off" for TorchTitan, "acceptance": bool}."""

    def primus(exp: Path, steps_key: str, on: list[str], off: list[str], more: list[str] | None = None):
        def build(extra):
            return lambda ws, i: [PRIMUS, "train", str(exp), f"workspace={ws}", f"exp_name=run{i}",
                                  f"{steps_key}={steps}", *(more or []), *extra]
        return {"on": build(on), "off": build(off)}

    def bare(preset: Path, batch: int, seq: int, lr: float):
        def build(ckpt):
            return lambda ws, i: [PY, "-m", "benchmarks.bare.torchtitan_bare", "--preset", str(preset), "--assets",
                                  str(TT_ASSETS), "--dump", str(ws / f"bare{i}"), "--steps", str(steps), "--batch",
                                  str(batch), "--seq", str(seq), "--lr", str(lr), "--without-patch", FIX,
                                  "--checkpoint-interval", str(ckpt)]
        return {"bare_on": build(interval), "bare_off": build(0)}

    tt_on, tt_off = ["checkpoint.enable=true", f"checkpoint.interval={interval}"], ["checkpoint.enable=false"]
    return {
        "torchtitan tiny demo": {**primus(TINY_TT, "training.steps", tt_on, tt_off), **bare(TINY_PRESET, 4, 128, 3e-3),
                                 "acceptance": True},
        "torchtitan 25M preset": {**primus(CONFIGS / "torchtitan_llama_25m.yaml", "training.steps", tt_on, tt_off),
                                  **bare(PRESET_25M, 2, 256, 1e-3), "acceptance": True},
        "megatron tiny demo": {**primus(TINY_MG, "train_iters", [f"save_interval={interval}"],
                                        [f"save_interval={10 * steps}"], ["eval_interval=100000", "eval_iters=0"]),
                               "acceptance": False},
        "nemo_automodel tiny Wan": {**primus(CONFIGS / "automodel_wan_tiny.yaml", "step_scheduler.max_steps",
                                             ["checkpoint.enabled=true", f"step_scheduler.ckpt_every_steps={interval}"],
                                             ["checkpoint.enabled=false"]), "acceptance": False},
    }


def _steady(run, first: int, last: int) -> float | None:
    times = [t for s in range(first, last + 1) if (t := run.step_time(s)) is not None]
    return median(times)


def measure(name: str, case: dict[str, Any], *, reps: int, steps: int, interval: int) -> dict[str, Any]:
    ws = Path(tempfile.mkdtemp(prefix="primus-bench-ckpt-"))
    variants = [v for v in ("on", "off", "bare_on", "bare_off") if v in case]
    order = [v for r in range(reps) for v in (variants if r % 2 == 0 else variants[::-1])]  # ABBA over variants
    first = interval + 3
    runs: dict[str, list] = {v: [] for v in variants}
    try:
        for i, variant in enumerate(order):
            run = run_probed(f"{name}:{variant}#{i}", case[variant](ws, i), env={"BENCH_PROBE_WAKEUPS": "1"},
                             verbose=True)
            runs[variant].append(run)
    finally:
        shutil.rmtree(ws, ignore_errors=True)

    def summary(variant: str) -> dict[str, Any]:
        ok = [r for r in runs[variant] if r.rc == 0 and len(r.step_ends) >= steps]
        meds = [m for r in ok if (m := _steady(r, first, steps)) is not None]
        # OpenMP wake-ups per step after the first save: ~5 spinning, ~500 throttled (tiny demo)
        wakes = [median([b - a for a, b in zip(r.wakeups[first - 2:], r.wakeups[first - 1:])]) for r in ok
                 if len(r.wakeups) >= steps]
        return {"step_time_s": median(meds), "run_medians_s": meds, "runs_ok": len(ok),
                "wakeups_per_step": median([w for w in wakes if w is not None]),
                "threads_at_first_step": [r.threads[0] for r in ok if r.threads],
                "threads_at_last_step": [r.threads[-1] for r in ok if r.threads]}

    out: dict[str, Any] = {"case": name, "steps": steps, "interval": interval, "steady_steps": [first, steps],
                           "reps": reps, "acceptance_row": case["acceptance"]}
    out.update({variant: summary(variant) for variant in variants})

    def ratio(a: str, b: str) -> float | None:
        x, y = out[a]["step_time_s"], out[b]["step_time_s"]
        return x / y if x and y else None

    out["ratio"] = ratio("on", "off")
    if "bare_on" in out:
        out["ratio_upstream"] = ratio("bare_on", "bare_off")
    out["target_met"] = out["ratio"] is not None and out["ratio"] <= TARGET
    out["acceptance_met"] = out["ratio"] is not None and out["ratio"] <= ACCEPT
    return out


def run(quick: bool) -> dict[str, Any]:
    steps, interval = (22, 8) if quick else (30, 10)
    cases = _cases(steps, interval)
    chosen = ["torchtitan tiny demo", "torchtitan 25M preset"] if quick else list(cases)
    return {"threads": "torch default (no OMP_NUM_THREADS)", "target": TARGET, "acceptance": ACCEPT,
            "cases": [measure(n, cases[n], reps=1 if quick else 2, steps=steps, interval=interval) for n in chosen]}


def markdown(results: dict[str, Any]) -> str:
    rows = []
    for c in results["cases"]:
        def grown(variant: str) -> str:
            v = c.get(variant)
            return "—" if not v else ", ".join(f"{a}→{b}" for a, b in zip(v["threads_at_first_step"],
                                                                          v["threads_at_last_step"]))
        threads = f"on {grown('on')}; off {grown('off')}; bare on {grown('bare_on')}"
        upstream = fmt(c.get("ratio_upstream"), ".3f") if "ratio_upstream" in c else "—"
        wakes = " / ".join(fmt((c.get(v) or {}).get("wakeups_per_step"), ".0f") for v in ("on", "off", "bare_on"))
        rows.append([c["case"], fmt(c["on"]["step_time_s"], ".4f"), fmt(c["off"]["step_time_s"], ".4f"),
                     f"**{fmt(c['ratio'], '.3f')}**", "yes" if c["target_met"] else "no",
                     "yes" if c["acceptance_met"] else "no", upstream, threads, wakes,
                     f"{c['steady_steps'][0]}–{c['steady_steps'][1]}"])
    return (md_table(["case", "step ckpt on (s)", "step ckpt off (s)", "on / off", f"≤{results['target']}",
                      f"≤{results['acceptance']}", "bare engine without the fix: on / off",
                      "threads, first→last step", "wake-ups/step on / off / bare on", "steps compared"], rows)
            + f"\n\nIntra-op threads: {results['threads']}. A save every `interval` steps vs none, interleaved; "
              "ratio of the median steady step times.")
