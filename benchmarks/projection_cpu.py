"""`primus plan --project --device local` against measured step times on this CPU.

    .venv/bin/python -m benchmarks.projection_cpu [--quick] [--steps N]
    .venv/bin/python -m benchmarks.projection_cpu --reproject benchmarks/results/projection_cpu.json

1. `primus preflight --nproc-per-node 2 --tests gemm,membw,allreduce` measures this host and writes
   the `local` profile (into a private cache directory);
2. each layout below (the 25M preset on TorchTitan and Megatron, the tiny MoEs for EP) trains for a
   few steps through `primus train`; its median step time (steps 3..N, the optimizer-step probe) is the
   measurement;
3. each is projected as `primus plan EXP --project --device local --nproc-per-node N` would.

Reports MAPE and Kendall's tau between projected and measured step times; writes
benchmarks/results/projection_cpu.json and the table into docs/plan.md (between its markers).
A shared, loaded machine makes both the profile and the runs noisy: run it on a quiet one.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import CONFIGS, PRIMUS, REPO, machine, md_table, median, run_probed, save

EXAMPLES = REPO / "examples"
MG, TT = CONFIGS / "megatron_llama_25m.yaml", CONFIGS / "torchtitan_llama_25m.yaml"
MG_MOE, TT_MOE = EXAMPLES / "megatron/mixtral_tiny-pretrain.yaml", EXAMPLES / "torchtitan/deepseek_v3_tiny-moe-pretrain.yaml"
FP32_TT = ["training.mixed_precision_param=float32"]
LAYOUTS: list[tuple[str, Path, int, list[str]]] = [  # name, experiment, ranks, overrides
    ("megatron 1 rank mbs2", MG, 1, ["micro_batch_size=2", "global_batch_size=2"]),
    ("megatron 1 rank mbs4", MG, 1, ["micro_batch_size=4", "global_batch_size=4"]),
    ("megatron 1 rank recompute", MG, 1, ["micro_batch_size=2", "global_batch_size=2", "recompute_granularity=full",
                                          "recompute_method=uniform", "recompute_num_layers=1"]),
    ("megatron 2 ranks DP", MG, 2, ["micro_batch_size=1", "global_batch_size=2"]),
    ("megatron 2 ranks TP", MG, 2, ["micro_batch_size=2", "global_batch_size=2", "tensor_model_parallel_size=2"]),
    ("megatron 2 ranks PP 4 micro-batches", MG, 2, ["micro_batch_size=1", "global_batch_size=4",
                                                    "pipeline_model_parallel_size=2"]),
    ("megatron 2 ranks EP (tiny MoE)", MG_MOE, 2, ["bf16=false"]),
    ("torchtitan 1 rank", TT, 1, ["training.local_batch_size=2"]),
    ("torchtitan 1 rank full AC", TT, 1, ["training.local_batch_size=2", "activation_checkpoint.mode=full"]),
    ("torchtitan 2 ranks FSDP", TT, 2, ["training.local_batch_size=1", "parallelism.data_parallel_shard_degree=2"]),
    ("torchtitan 2 ranks TP", TT, 2, ["training.local_batch_size=2", "parallelism.tensor_parallel_degree=2",
                                      "parallelism.data_parallel_shard_degree=1"]),
    ("torchtitan 2 ranks EP (tiny MoE)", TT_MOE, 2, FP32_TT),
]
QUICK = ("megatron 1 rank mbs2", "megatron 2 ranks TP", "torchtitan 1 rank", "torchtitan 2 ranks FSDP")
MAPE_TARGET, TAU_TARGET = 0.25, 0.7


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-a between two rankings (pairs tied in either count as neither)."""
    concordant = discordant = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            s = (a[i] - a[j]) * (b[i] - b[j])
            concordant += s > 0
            discordant += s < 0
    pairs = len(a) * (len(a) - 1) / 2
    return (concordant - discordant) / pairs if pairs else 1.0


def measure_profile(cache: Path) -> Path:
    env = {**os.environ, "PRIMUS_PROFILE_CACHE": str(cache)}
    report = Path(tempfile.mkdtemp(prefix="primus-bench-preflight-"))
    subprocess.run([PRIMUS, "preflight", "--nproc-per-node", "2", "--tests", "gemm,membw,allreduce",
                    "--report-dir", str(report)], env=env, check=True, stdout=subprocess.DEVNULL, cwd=REPO)
    shutil.rmtree(report, ignore_errors=True)
    return next(cache.glob("*.json"))


def steps_key(exp: Path) -> str:
    return "training.steps" if "torchtitan" in str(exp) else "train_iters"


def project_layout(exp: Path, nproc: int, overrides: list[str], threads: int | None = None,
                   load_factor: float = 1.0, profile=None) -> dict[str, Any]:
    """The projection on the ``local`` profile (or ``profile``); ``load_factor`` scales its compute and
    memory rates by what a GEMM probe just before the run measured against the profile's (a shared
    host's load moves)."""
    from dataclasses import replace

    from primus.cli.plan_project import load
    from primus.plan.profiles import get_profile
    from primus.plan.projection import project

    loaded = load(str(exp), overrides, None, nproc, gpu=False, device="local")
    profile = (profile or get_profile("local")).for_ranks_per_node(nproc, threads)
    profile = replace(profile, peak_tflops={k: v * load_factor for k, v in profile.peak_tflops.items()},
                      hbm_gbps=profile.hbm_gbps * load_factor)
    result = project(loaded.model, loaded.layout, profile, loaded.options)
    return {"step_time": result.step_time, "breakdown": result.breakdown}


def run_layout(name: str, exp: Path, nproc: int, overrides: list[str], steps: int, ws: Path) -> dict[str, Any]:
    tag = "".join(c if c.isalnum() else "_" for c in name)
    cmd = [PRIMUS, "train", str(exp), f"workspace={ws}", f"exp_name={tag}", f"{steps_key(exp)}={steps}",
           "--nproc-per-node", str(nproc), *overrides]
    run = run_probed(name, cmd, verbose=True)
    times = run.step_times(2)
    return {"rc": run.rc, "measured": median(times), "step_times": times}


def load_factor(nproc: int, threads: int | None) -> float:
    """This host's GEMM rate now over the rate in its ``local`` profile, at a rank's thread count."""
    from primus.plan.devices import measure_cpu_gemm_tflops
    from primus.plan.profiles import get_profile

    profile = get_profile("local")
    per_rank = threads or max(1, (profile.cores or 1) // nproc)
    now = measure_cpu_gemm_tflops("fp32", per_rank, budget_s=1.0)
    return now / profile.for_ranks_per_node(nproc, threads).peak("fp32") * 1e12


def run(quick: bool, steps: int, threads: int | None = None, reprobe: bool = False) -> dict[str, Any]:
    cache = Path(tempfile.mkdtemp(prefix="primus-bench-profile-"))
    ws = Path(tempfile.mkdtemp(prefix="primus-bench-projection-"))
    os.environ["PRIMUS_PROFILE_CACHE"] = str(cache)
    if threads:  # every rank, 1 or 2 per host, runs this many intra-op threads (OMP_NUM_THREADS)
        os.environ["OMP_NUM_THREADS"] = str(threads)
    points = []
    try:
        profile_path = measure_profile(cache)
        for name, exp, nproc, overrides in LAYOUTS:
            if quick and name not in QUICK:
                continue
            point = {"layout": name, "experiment": str(exp.relative_to(REPO)), "ranks": nproc, "overrides": overrides}
            factor = load_factor(nproc, threads) if reprobe else 1.0
            point.update(run_layout(name, exp, nproc, overrides, steps, ws))
            if reprobe:
                factor = (factor + load_factor(nproc, threads)) / 2  # the load before and after the run
            point["load_factor"] = factor
            point.update(project_layout(exp, nproc, overrides, threads, factor))
            if point["measured"]:
                point["error"] = (point["step_time"] - point["measured"]) / point["measured"]
            points.append(point)
        profile = profile_path.read_text()
    finally:
        shutil.rmtree(ws, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
    ok = [p for p in points if p.get("measured")]
    result = {"machine": machine(), "steps": steps, "threads_per_rank": threads or "cores / ranks", "reprobe": reprobe,
              "profile": profile, "points": points,
              "mape": statistics.mean(abs(p["error"]) for p in ok) if ok else None,
              "kendall_tau": kendall_tau([p["step_time"] for p in ok], [p["measured"] for p in ok]) if ok else None,
              "mape_target": MAPE_TARGET, "tau_target": TAU_TARGET}
    return result


def probes_predated(data: dict[str, Any], rounds: int = 3) -> dict[str, Any]:
    """The probes a stored CPU profile predates, measured now on this host as ratios to a probe the
    stored profile has (a load slows both alike): grouped over plain GEMM per dtype, and AdamW's seconds
    per parameter in bytes of the copy probe; best of ``rounds`` interleaved, one thread; gloo's
    reduce-scatter is an all-reduce whatever the host."""
    from primus.plan.devices import measure_cpu_gemm_tflops, measure_cpu_grouped_gemm_tflops
    from primus.preflight.perf.profile import optimizer_s_per_param

    fields: dict[str, Any] = {"reduce_scatter_as_allreduce": True}
    if "grouped_gemm_tflops" not in data:
        best: dict[tuple[str, str], float] = {}
        for _ in range(rounds):
            for dtype in ("fp32", "bf16"):
                for kind, probe in (("grouped", measure_cpu_grouped_gemm_tflops), ("plain", measure_cpu_gemm_tflops)):
                    best[dtype, kind] = max(best.get((dtype, kind), 0.0), probe(dtype, 1, 1.0))
        fields["grouped_gemm_tflops"] = {
            dtype: data["peak_tflops"][dtype] * best[dtype, "grouped"] / best[dtype, "plain"]
            for dtype in ("fp32", "bf16") if dtype in data["peak_tflops"]}
    if "optimizer_s_per_param" not in data:
        import torch

        previous = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            src = torch.ones(2**26)  # 256 MB, beyond the caches as the probe's
            dst = torch.empty_like(src)
            step, copy = float("inf"), float("inf")
            for _ in range(rounds):  # best of each, as preflight's own probes
                step = min(step, optimizer_s_per_param())
                for _ in range(5):
                    start = time.perf_counter()
                    dst.copy_(src)
                    copy = min(copy, time.perf_counter() - start)
            copy = 2 * src.numel() * 4 / copy  # bytes/s
        finally:
            torch.set_num_threads(previous)
        fields["optimizer_s_per_param"] = step * copy / (data["hbm_gbps"] * 1e9)  # its bytes of copy, stored rate
    return fields


def reproject(path: Path, fill: dict[str, Any] | None = None) -> dict[str, Any]:
    """The stored points of an earlier run projected again with the current model, nothing run: the
    same measurements, profile and load factors. The probes a stored profile predates are measured now
    (``probes_predated``), or taken from ``fill``."""

    from primus.plan.profiles import DeviceProfile

    stored = json.loads(path.read_text())
    data = json.loads(stored["profile"])
    fill = probes_predated(data) if fill is None else fill
    profile = DeviceProfile.from_dict({**data, **fill})
    threads = stored["threads_per_rank"] if isinstance(stored["threads_per_rank"], int) else None
    points = []
    for old in stored["points"]:
        point = {key: old[key] for key in ("layout", "experiment", "ranks", "overrides", "rc", "measured",
                                             "step_times", "load_factor") if key in old}
        point["before"] = {"step_time": old["step_time"], "error": old.get("error")}
        point.update(project_layout(REPO / old["experiment"], old["ranks"], old["overrides"], threads,
                                    old.get("load_factor", 1.0), profile))
        if point.get("measured"):
            point["error"] = (point["step_time"] - point["measured"]) / point["measured"]
        points.append(point)
    ok = [p for p in points if p.get("measured")]
    return {**stored, "points": points, "reprojected_from": str(path), "before": {
                "mape": stored["mape"], "kendall_tau": stored["kendall_tau"]},
            "filled": fill, "mape": statistics.mean(abs(p["error"]) for p in ok) if ok else None,
            "kendall_tau": kendall_tau([p["step_time"] for p in ok], [p["measured"] for p in ok]) if ok else None}


def markdown(r: dict[str, Any]) -> str:
    rows = [[p["layout"], p["ranks"], f"{p['measured']:.3f}" if p.get("measured") else f"failed (rc {p['rc']})",
             f"{p['step_time']:.3f}", f"{100 * p['error']:+.1f}%" if "error" in p else "n/a"] for p in r["points"]]
    table = md_table(["layout", "ranks", "measured median step (s)", "projected (s)", "error"], rows)
    return (table + f"\n\nMAPE {100 * r['mape']:.1f}% (target ≤ {100 * MAPE_TARGET:.0f}%), Kendall τ "
            f"{r['kendall_tau']:.2f} (target ≥ {TAU_TARGET}); {len(r['points'])} layouts, "
            f"{r['threads_per_rank']} thread(s) per rank{', profile rescaled per run (--reprobe)' if r.get('reprobe') else ''}, load average at start "
            f"{r['machine']['loadavg_at_start'][0]:.1f} on {r['machine']['cores']} cores.")


def write_docs(section: str, marker: str) -> None:
    """Replace the text between ``<!-- marker:begin -->`` and ``<!-- marker:end -->`` in docs/plan.md."""
    path = REPO / "docs" / "plan.md"
    text = path.read_text()
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        path.write_text(head + begin + "\n" + section + "\n" + end + rest.split(end, 1)[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{len(QUICK)} layouts only")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, help="intra-op threads per rank (OMP_NUM_THREADS) for every run; "
                        "default: torch's (all cores for 1 rank, 1 each for 2 ranks)")
    parser.add_argument("--reprobe", action="store_true",
                        help="on a shared, loaded host: scale the profile by a GEMM probe taken before and after "
                             "each run (the load the run saw), instead of the profile measured once at the start")
    parser.add_argument("--no-docs", action="store_true", help="do not rewrite the table in docs/plan.md")
    parser.add_argument("--reproject", type=Path, metavar="FILE",
                        help="project a stored result's points again with the current model (nothing is run); "
                             "prints the table and the MAPE and tau before and after, writes nothing")
    parser.add_argument("--fill", type=json.loads, metavar="JSON",
                        help="with --reproject: the profile fields the stored run predates, as JSON, instead of "
                             "measuring them now (the line --reproject prints)")
    args = parser.parse_args(argv)
    if args.reproject:
        result = reproject(args.reproject, args.fill)
        print(markdown(result))
        print(f"before: MAPE {100 * result['before']['mape']:.1f}%, τ {result['before']['kendall_tau']:.2f}")
        print(f"filled: {json.dumps(result['filled'])}")
        return 0
    result = run(args.quick, args.steps, args.threads, args.reprobe)
    path = save("projection_cpu", result)
    text = markdown(result)
    print(text)
    if not args.no_docs and not args.quick:
        write_docs(text, "projection_cpu")
    print(f"results: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
