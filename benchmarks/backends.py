"""Backend comparison on one neutral model preset (``configs/presets/llama_25m.yaml``): tokens/s,
peak memory and the loss curve at 1 and 2 ranks, same global batch (same tokens per step), all
through ``primus train``. The "switch backends" promise is TorchTitan vs Megatron on the same
preset; Megatron joins when its backend validates (hook below), until then the table holds the
TorchTitan layouts, whose loss curves must agree with the 1-rank run within ``LOSS_TOL``.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import CONFIGS, PRIMUS, fmt, md_table, median, metrics_jsonl, run_probed
from benchmarks.overhead import megatron_ready

SEQ, GLOBAL_BATCH = 256, 2
LOSS_TOL = 0.10  # relative |mean loss of the last 3 steps - 1 rank's|: ranks see differently sharded data
CROSS_TOL = 0.25  # across backends: |final loss| difference (different init RNG streams and data order)
LAYOUTS = {  # backend -> [(name, nproc, overrides)]; every layout has global batch 2 x seq 256
    "torchtitan": [
        ("1 rank", 1, ["training.local_batch_size=2"]),
        ("2 ranks FSDP", 2, ["training.local_batch_size=1", "parallelism.data_parallel_shard_degree=2"]),
        ("2 ranks DDP", 2, ["training.local_batch_size=1", "parallelism.data_parallel_replicate_degree=2",
                            "parallelism.data_parallel_shard_degree=1"]),
        ("2 ranks TP", 2, ["training.local_batch_size=2", "parallelism.tensor_parallel_degree=2",
                           "parallelism.data_parallel_shard_degree=1"]),
    ],
    "megatron": [
        ("1 rank", 1, ["micro_batch_size=2"]),
        ("2 ranks DDP", 2, ["micro_batch_size=1"]),
        ("2 ranks TP", 2, ["micro_batch_size=2", "tensor_model_parallel_size=2"]),
    ],
}
EXPERIMENTS = {"torchtitan": ("torchtitan_llama_25m.yaml", "training.steps"),
               "megatron": ("megatron_llama_25m.yaml", "train_iters")}


def run(quick: bool) -> dict[str, Any]:
    ws = Path(tempfile.mkdtemp(prefix="primus-bench-backends-"))
    steps = 6 if quick else 10
    backends = ["torchtitan"] + (["megatron"] if megatron_ready() else [])
    points = []
    try:
        for backend in backends:
            exp, steps_key = EXPERIMENTS[backend]
            for i, (name, nproc, extra) in enumerate(LAYOUTS[backend][:2] if quick else LAYOUTS[backend]):
                exp_name = f"{backend}{i}"
                cmd = [PRIMUS, "train", str(CONFIGS / exp), f"workspace={ws}", f"exp_name={exp_name}",
                       f"{steps_key}={steps}", "--nproc-per-node", str(nproc), *extra]
                run = run_probed(f"{backend}:{name}", cmd, verbose=True)
                step = median(run.step_times(2))
                metrics = metrics_jsonl(ws / "bench" / "bench" / exp_name)
                points.append({"backend": backend, "layout": name, "nproc": nproc, "rc": run.rc, "step_time_s": step,
                               "tokens_per_s": GLOBAL_BATCH * SEQ / step if step else None,
                               "max_rss_gb_rank0": run.max_rss_gb, "first_step_s": run.first_step_s,
                               "losses": [m["loss"] for m in metrics],
                               "primus_tokens_per_s": median([m["tokens_per_sec"] for m in metrics[2:]
                                                              if m.get("tokens_per_sec")])})
    finally:
        shutil.rmtree(ws, ignore_errors=True)
    for backend in backends:
        mine = [p for p in points if p["backend"] == backend]
        ref = mine[0]["losses"] if mine else []
        for p in mine:
            diffs = [abs(a - b) for a, b in zip(p["losses"], ref)]
            p["max_loss_diff_vs_1rank"] = max(diffs) if diffs else None
            tail, ref_tail = p["losses"][-3:], ref[-3:]
            rel = (abs(sum(tail) / len(tail) - sum(ref_tail) / len(ref_tail)) / (sum(ref_tail) / len(ref_tail))
                   if tail and ref_tail else None)
            p["tail_loss_rel_diff_vs_1rank"] = rel
            p["loss_within_tol"] = rel is not None and rel <= LOSS_TOL and len(p["losses"]) == len(ref)
    cross = None
    tt = next((p for p in points if p["backend"] == "torchtitan" and p["nproc"] == 1 and p["losses"]), None)
    mg = next((p for p in points if p["backend"] == "megatron" and p["nproc"] == 1 and p["losses"]), None)
    if tt and mg:
        cross = {"torchtitan_final_loss": tt["losses"][-1], "megatron_final_loss": mg["losses"][-1],
                 "final_loss_diff": abs(tt["losses"][-1] - mg["losses"][-1]),
                 "within_tol": abs(tt["losses"][-1] - mg["losses"][-1]) <= CROSS_TOL,
                 "tokens_per_s_ratio_megatron_over_torchtitan":
                     (mg["tokens_per_s"] / tt["tokens_per_s"]) if mg["tokens_per_s"] and tt["tokens_per_s"] else None}
    return {"model": "benchmarks/configs/presets/llama_25m.yaml", "seq_len": SEQ, "global_batch": GLOBAL_BATCH,
            "steps": steps, "loss_tol": LOSS_TOL, "cross_tol": CROSS_TOL, "points": points, "cross_backend": cross,
            "megatron": {"status": "benchmarked" if "megatron" in backends else
                         "not benchmarked: the Megatron backend did not validate when this ran"}}


def markdown(r: dict[str, Any]) -> str:
    rows = [[p["backend"], p["layout"], fmt(p["step_time_s"], ".3f"), fmt(p["tokens_per_s"], ".0f"),
             fmt(p["max_rss_gb_rank0"], ".2f"), fmt(p["losses"][-1] if p["losses"] else None, ".3f"),
             fmt(p["max_loss_diff_vs_1rank"], ".3f"),
             fmt(100 * p["tail_loss_rel_diff_vs_1rank"] if p.get("tail_loss_rel_diff_vs_1rank") is not None else None,
                 ".1f") + "%", "yes" if p["loss_within_tol"] else "no", p["rc"]] for p in r["points"]]
    return (md_table(["backend", "layout", "step (s)", "tokens/s", "peak RSS rank 0 (GB)", "final loss",
                      "max |Δloss| vs 1 rank", "last-3 mean Δ vs 1 rank", f"≤ {100 * r['loss_tol']:.0f}%", "rc"], rows)
            + f"\n\nMegatron: {r['megatron']['status']}. Cross-backend (1 rank): {r.get('cross_backend')}")
