"""bf16 vs fp32 on CPU through ``primus train``, per backend: tokens/s and the loss curves.

Each backend runs its 25M experiment (TorchTitan, Megatron) or the small Wan (AutoModel) in fp32
and in bf16, interleaved ABBA, at torch's default intra-op threads. bf16 is what each backend
calls it: TorchTitan ``training.mixed_precision_param=bfloat16`` (FSDP2 ``MixedPrecisionPolicy``,
installed by TorchTitan even on one rank), Megatron ``bf16`` (``Float16Module``, fp32 main
params and grads), AutoModel ``model.compute_dtype=bfloat16``. On a CPU without bf16 units
Primus derives fp32 (one line); the benchmark sets ``PRIMUS_CPU_BF16=force`` there so the bf16
path is still measured, and records whether the CPU has the units (``bf16_native``).

Loss agreement: the mean loss of the last ``TAIL`` steps, bf16 vs fp32, relative; the stated
tolerance is ``LOSS_TOL``.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import CONFIGS, PRIMUS, fmt, md_table, median, metrics_jsonl, run_probed

TAIL, LOSS_TOL, TARGET, ACCEPT = 5, 0.05, 1.5, 1.3
CASES = {  # backend -> (experiment, steps key, fp32 overrides, bf16 overrides, tokens per step or None)
    "torchtitan": ("torchtitan_llama_25m.yaml", "training.steps", ["training.mixed_precision_param=float32"],
                   ["training.mixed_precision_param=bfloat16"], 2 * 256),
    "megatron": ("megatron_llama_25m.yaml", "train_iters", ["bf16=false"], ["bf16=true"], 2 * 256),
    "nemo_automodel": ("automodel_wan_small.yaml", "step_scheduler.max_steps", ["model.compute_dtype=float32"],
                       ["model.compute_dtype=bfloat16"], None),
}


def _tail_mean(losses: list[float]) -> float | None:
    return sum(losses[-TAIL:]) / len(losses[-TAIL:]) if len(losses) >= TAIL else None


def measure(backend: str, *, reps: int, steps: int, skip: int) -> dict[str, Any]:
    from primus.plan.devices import CPU_BF16_ENV, cpu_bf16_native

    exp, steps_key, fp32, bf16, tokens = CASES[backend]
    native = cpu_bf16_native()
    ws = Path(tempfile.mkdtemp(prefix=f"primus-bench-precision-{backend}-"))
    runs: dict[str, list[dict[str, Any]]] = {"fp32": [], "bf16": []}
    pattern = ["fp32", "bf16", "bf16", "fp32"]
    try:
        if backend == "nemo_automodel":
            from benchmarks.overhead import build_small_wan_assets

            build_small_wan_assets()
        for i in range(2 * reps):
            dtype = pattern[i % 4]
            name = f"{backend}_{dtype}_{i}"
            cmd = [PRIMUS, "train", str(CONFIGS / exp), f"workspace={ws}", f"exp_name={name}", f"{steps_key}={steps}",
                   *(fp32 if dtype == "fp32" else bf16)]
            env = {CPU_BF16_ENV: "force"} if dtype == "bf16" else {CPU_BF16_ENV: "off"}
            run = run_probed(f"{backend}:{dtype}#{i}", cmd, env=env, verbose=True)
            losses = [m["loss"] for m in metrics_jsonl(ws / "bench" / "bench" / name)]
            runs[dtype].append({"rc": run.rc, "step_time_s": median(run.step_times(skip)), "losses": losses,
                                "first_step_s": run.first_step_s, "max_rss_gb": run.max_rss_gb})
    finally:
        shutil.rmtree(ws, ignore_errors=True)
    step = {d: median([r["step_time_s"] for r in rs if r["rc"] == 0 and r["step_time_s"]]) for d, rs in runs.items()}
    curve = {d: next((r["losses"] for r in rs if r["rc"] == 0 and r["losses"]), []) for d, rs in runs.items()}
    tails = {d: _tail_mean(c) for d, c in curve.items()}
    speedup = step["fp32"] / step["bf16"] if step["fp32"] and step["bf16"] else None
    rel = abs(tails["bf16"] - tails["fp32"]) / tails["fp32"] if tails["fp32"] and tails["bf16"] is not None else None
    return {"backend": backend, "experiment": exp, "steps": steps, "reps": reps, "bf16_native": native,
            "bf16_forced": native is None, "runs": runs, "step_time_s": step,
            "tokens_per_s": {d: tokens / s if (tokens and s) else None for d, s in step.items()},
            "speedup_bf16": speedup, "tail_loss": tails, "tail_loss_rel_diff": rel,
            "loss_within_tol": rel is not None and rel <= LOSS_TOL, "loss_curves": curve}


def run(quick: bool) -> dict[str, Any]:
    steps = 20 if quick else 40
    backends = ["torchtitan"] if quick else list(CASES)
    return {"loss_tol": LOSS_TOL, "tail": TAIL, "target": TARGET, "acceptance": ACCEPT,
            "cases": [measure(b, reps=1 if quick else 2, steps=steps, skip=3) for b in backends]}


def markdown(results: dict[str, Any]) -> str:
    rows = []
    for c in results["cases"]:
        unit = "tokens/s" if c["tokens_per_s"]["fp32"] else "s/step"
        fp32 = c["tokens_per_s"]["fp32"] if unit == "tokens/s" else c["step_time_s"]["fp32"]
        bf16 = c["tokens_per_s"]["bf16"] if unit == "tokens/s" else c["step_time_s"]["bf16"]
        rows.append([c["backend"], c["experiment"], f"{fmt(fp32, '.1f' if unit == 'tokens/s' else '.3f')} {unit}",
                     f"{fmt(bf16, '.1f' if unit == 'tokens/s' else '.3f')} {unit}", f"**{fmt(c['speedup_bf16'], '.2f')}×**",
                     fmt(c["tail_loss"]["fp32"], ".3f"), fmt(c["tail_loss"]["bf16"], ".3f"),
                     fmt(100 * c["tail_loss_rel_diff"] if c["tail_loss_rel_diff"] is not None else None, ".1f") + "%",
                     "yes" if c["loss_within_tol"] else "no",
                     c["bf16_native"] or "none (bf16 forced, emulated)"])
    return (md_table(["backend", "experiment", "fp32", "bf16", "bf16 speed-up", f"fp32 loss (last {results['tail']})",
                      "bf16 loss", "Δ", f"≤{100 * results['loss_tol']:.0f}%", "CPU bf16 units"], rows)
            + f"\n\nTarget bf16/fp32 ≥ {results['target']}× (acceptance {results['acceptance']}×) on the 25M "
              "TorchTitan preset; it needs bf16 units (AMX-BF16 / AVX512-BF16).")
