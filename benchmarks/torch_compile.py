"""torch.compile on CPU, per backend: what it costs up front, what it saves per step, and when it pays.

Eager vs compiled through ``primus train``, interleaved ABBA, torch's default threads:
TorchTitan ``compile.enable`` (per transformer block + loss) on the 25M preset, AutoModel
``fsdp.enable_compile`` (per block) on the small Wan. Megatron: megatron-core 0.16 has no
torch.compile switch for ``GPTModel`` (Megatron-LM's are CUDA-graph and TE options), so it is
not measured. Up-front cost = time to the end of step 1 (compile happens there) minus eager's;
saving = eager median step - compiled median step (after ``skip`` warm-up steps, which also
absorb recompiles). Break-even step = up-front cost / saving ("never" when compiled is not faster).
"""
from __future__ import annotations

import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import CONFIGS, PRIMUS, fmt, md_table, median, run_probed

CASES = {  # backend -> (experiment, steps key, eager overrides, compiled overrides)
    "torchtitan": ("torchtitan_llama_25m.yaml", "training.steps", ["compile.enable=false"], ["compile.enable=true"]),
    "nemo_automodel": ("automodel_wan_small.yaml", "step_scheduler.max_steps", ["fsdp.enable_compile=false"],
                       ["fsdp.enable_compile=true"]),
}


def measure(backend: str, *, reps: int, steps: int, skip: int) -> dict[str, Any]:
    exp, steps_key, eager, compiled = CASES[backend]
    ws = Path(tempfile.mkdtemp(prefix=f"primus-bench-compile-{backend}-"))
    runs: dict[str, list] = {"eager": [], "compiled": []}
    pattern = ["eager", "compiled", "compiled", "eager"]
    try:
        if backend == "nemo_automodel":
            from benchmarks.overhead import build_small_wan_assets

            build_small_wan_assets()
        for i in range(2 * reps):
            mode = pattern[i % 4]
            cmd = [PRIMUS, "train", str(CONFIGS / exp), f"workspace={ws}", f"exp_name={backend}_{mode}_{i}",
                   f"{steps_key}={steps}", *(eager if mode == "eager" else compiled)]
            runs[mode].append(run_probed(f"{backend}:{mode}#{i}", cmd, verbose=True))
    finally:
        shutil.rmtree(ws, ignore_errors=True)
    step = {m: median([median(r.step_times(skip)) for r in rs if r.rc == 0 and r.step_times(skip)])
            for m, rs in runs.items()}
    first = {m: median([r.first_step_s for r in rs if r.rc == 0 and r.first_step_s is not None])
             for m, rs in runs.items()}
    upfront = first["compiled"] - first["eager"] if first["compiled"] and first["eager"] else None
    saving = step["eager"] - step["compiled"] if step["eager"] and step["compiled"] else None
    break_even = (math.ceil(upfront / saving) if upfront is not None and upfront > 0 else 1) \
        if saving is not None and saving > 0 else None
    return {"backend": backend, "experiment": exp, "steps": steps, "reps": reps, "skip": skip,
            "step_time_s": step, "first_step_s": first, "upfront_s": upfront, "saving_per_step_s": saving,
            "speedup": step["eager"] / step["compiled"] if saving is not None else None,
            "break_even_steps": break_even,
            "runs": {m: [r.summary(skip) for r in rs] for m, rs in runs.items()}}


def run(quick: bool) -> dict[str, Any]:
    steps = 12 if quick else 24
    backends = ["torchtitan"] if quick else list(CASES)
    return {"megatron": "not applicable: megatron-core 0.16 offers no torch.compile switch for GPTModel",
            "cases": [measure(b, reps=1 if quick else 2, steps=steps, skip=4) for b in backends]}


def markdown(results: dict[str, Any]) -> str:
    rows = [[c["backend"], c["experiment"], fmt(c["step_time_s"]["eager"], ".3f"), fmt(c["step_time_s"]["compiled"], ".3f"),
             f"**{fmt(c['speedup'], '.2f')}×**", fmt(c["first_step_s"]["eager"], ".1f"),
             fmt(c["first_step_s"]["compiled"], ".1f"), fmt(c["upfront_s"], "+.1f"),
             c["break_even_steps"] if c["break_even_steps"] is not None else "never"] for c in results["cases"]]
    return (md_table(["backend", "experiment", "eager step (s)", "compiled step (s)", "speed-up",
                      "1st step eager (s)", "1st step compiled (s)", "compile cost (s)", "pays after (steps)"], rows)
            + f"\n\nMegatron: {results['megatron']}.")
