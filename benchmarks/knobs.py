"""Operating points: the knobs users tune, through ``primus train``, one change at a time from a
baseline, on each backend. Throughput from the step probe (median step time after warm-up),
memory = peak RSS of rank 0 (on CPU Primus's ``mem`` is peak RSS too). The CPU analogue of
"bs32 AC-on vs bs8 AC-off": what each knob buys or costs here.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import CONFIGS, PRIMUS, fmt, md_table, median, run_probed

TT_SEQ = 256
TT_POINTS = [  # (name, overrides, local batch)
    ("baseline: bs2, AC off, eager, foreach AdamW", [], 2),
    ("activation checkpointing: selective", ["activation_checkpoint.mode=selective"], 2),
    ("activation checkpointing: full", ["activation_checkpoint.mode=full"], 2),
    ("torch.compile", ["compile.enable=true"], 2),
    ("optimizer: for-loop (not foreach)", ["optimizer.implementation=for-loop"], 2),
    ("micro-batch 4", [], 4),
    ("micro-batch 4 + full AC", ["activation_checkpoint.mode=full"], 4),
]
TT_QUICK = {0, 1, 3, 5}
AM_POINTS = [
    ("baseline: fp32, AC off, eager, local bs1", []),
    ("bf16 compute", ["model.compute_dtype=bfloat16"]),
    ("activation checkpointing", ["fsdp.activation_checkpointing=true"]),
    ("torch.compile (per block)", ["fsdp.enable_compile=true"]),
    ("local batch 2 (no grad accumulation)", ["step_scheduler.local_batch_size=2"]),
]
AM_QUICK = {0, 1, 2}
MG_SEQ = 256
MG_POINTS = [  # (name, overrides, micro batch, global batch)
    ("baseline: fp32, no recompute, mbs2 = gbs2", [], 2, 2),
    ("recompute: selective (core attention)", ["recompute_granularity=selective"], 2, 2),
    ("recompute: full (uniform, 1 layer per checkpoint)",
     ["recompute_granularity=full", "recompute_method=uniform", "recompute_num_layers=1"], 2, 2),
    ("bf16 (Float16Module + fp32 main params)", ["bf16=true"], 2, 2),
    ("micro-batch 1 x 2 accumulation", [], 1, 2),
    ("micro-batch 4 = gbs4", [], 4, 4),
]
MG_QUICK = {0, 2, 3}


def _point(backend: str, name: str, cmd: list[str], samples_per_step: int, tokens_per_step: int | None,
           skip: int) -> dict[str, Any]:
    run = run_probed(f"{backend}:{name}", cmd, verbose=True)
    step = median(run.step_times(skip))
    return {"name": name, "rc": run.rc, "step_time_s": step, "samples_per_s": samples_per_step / step if step else None,
            "tokens_per_s": tokens_per_step / step if (step and tokens_per_step) else None,
            "max_rss_gb": run.max_rss_gb, "first_step_s": run.first_step_s, "cmd": " ".join(cmd[1:])}


def run(quick: bool) -> dict[str, Any]:
    ws = Path(tempfile.mkdtemp(prefix="primus-bench-knobs-"))
    out: dict[str, Any] = {"torchtitan": [], "megatron": [], "nemo_automodel": []}
    try:
        steps = 6 if quick else 10
        for i, (name, extra, batch) in enumerate(TT_POINTS):
            if quick and i not in TT_QUICK:
                continue
            cmd = [PRIMUS, "train", str(CONFIGS / "torchtitan_llama_25m.yaml"), f"workspace={ws}", f"exp_name=tt{i}",
                   f"training.steps={steps}", f"training.local_batch_size={batch}", f"training.seq_len={TT_SEQ}", *extra]
            out["torchtitan"].append(_point("torchtitan", name, cmd, batch, batch * TT_SEQ, skip=2))
        for i, (name, extra, mbs, gbs) in enumerate(MG_POINTS):
            if quick and i not in MG_QUICK:
                continue
            cmd = [PRIMUS, "train", str(CONFIGS / "megatron_llama_25m.yaml"), f"workspace={ws}", f"exp_name=mg{i}",
                   f"train_iters={steps}", f"micro_batch_size={mbs}", f"global_batch_size={gbs}",
                   f"seq_length={MG_SEQ}", *extra]
            out["megatron"].append(_point("megatron", name, cmd, gbs, gbs * MG_SEQ, skip=2))
        steps = 16 if quick else 30
        for i, (name, extra) in enumerate(AM_POINTS):
            if quick and i not in AM_QUICK:
                continue
            cmd = [PRIMUS, "train", str(CONFIGS / "automodel_wan_tiny.yaml"), f"workspace={ws}", f"exp_name=am{i}",
                   f"step_scheduler.max_steps={steps}", *extra]
            out["nemo_automodel"].append(_point("nemo_automodel", name, cmd, 2, None, skip=3))
    finally:
        shutil.rmtree(ws, ignore_errors=True)
    for backend, points in out.items():
        base = points[0] if points else None
        for p in points:
            if base and base.get("samples_per_s") and p.get("samples_per_s"):
                p["throughput_vs_baseline"] = p["samples_per_s"] / base["samples_per_s"]
            if base and base.get("max_rss_gb") and p.get("max_rss_gb"):
                p["memory_vs_baseline"] = p["max_rss_gb"] / base["max_rss_gb"]
    return out


def markdown(results: dict[str, Any]) -> str:
    parts = []
    for backend, unit in (("torchtitan", "tokens/s"), ("megatron", "tokens/s"), ("nemo_automodel", "samples/s")):
        rows = []
        for p in results.get(backend, []):
            rate = p["tokens_per_s"] if unit == "tokens/s" else p["samples_per_s"]
            rows.append([p["name"], fmt(p["step_time_s"], ".3f"), fmt(rate, ".1f"),
                         fmt(p.get("throughput_vs_baseline"), ".2f") + "×", fmt(p["max_rss_gb"], ".2f"),
                         fmt(p.get("memory_vs_baseline"), ".2f") + "×", p["rc"]])
        if rows:
            parts.append(f"**{backend}**\n\n" + md_table(["operating point", "step (s)", unit, "vs baseline",
                                                          "peak RSS (GB)", "vs baseline", "rc"], rows))
    return "\n\n".join(parts)
